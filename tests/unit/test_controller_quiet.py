"""The controller's Python stack starts without warnings: a line printed at ansible's start lands in every operator's
output and becomes an event without event_data in every ansible-runner job (nested rungs, tests). cryptography 51
printed a DSA deprecation warning at every start (requirements.txt pins 50.0.2)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ansible_playbook_starts_without_a_warning_line():
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), PATH=bindir + os.pathsep + os.environ["PATH"])
    proc = subprocess.run([os.path.join(bindir, "ansible-playbook"), "--version"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    noisy = [line for line in (proc.stdout + proc.stderr).splitlines() if "warning" in line.lower()]
    assert noisy == [], noisy
