"""testbed/engine/sim.py (issue 22): a rank in its own PID namespace, as in a real engine's container, sees the
host's desktop (fake_gdm.py) while it runs and stops seeing it when it stops.

The simulator read /.testbed/desktop.pid and checked the pid with kill(pid, 0). Under the stand-in engine the
rank shared the host's PID namespace; in a real container the host's pid does not exist, so spark3's desktop
was never counted: its KV budget stayed 0.98 GB instead of 0.68 GB, and wo_a_w8 (688 MiB) booted there and was
kept in the 6-rung campaign, which expects it to fail on spark3 (seen on the real engine, 2026-12-04)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTBED = Path(__file__).resolve().parents[2] / "testbed"
GDM = TESTBED / "standins" / "fake_gdm.py"
CHECK = (f"import sys; sys.path.insert(0, {str(TESTBED)!r}); from engine import sim\n"
         "sim.DESKTOP_PID = sys.argv[1]\nprint(sim.desktop_active())\n")

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="a PID namespace needs root and unshare")


def seen_from_a_container(pid_file: Path) -> str:
    """desktop_active() as a rank in a new PID namespace (its container's) answers it."""
    return subprocess.run(["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", CHECK, str(pid_file)],
                          capture_output=True, text=True, check=True).stdout.strip()


def start_desktop(pid_file: Path) -> subprocess.Popen:
    gdm = subprocess.Popen([sys.executable, str(GDM), str(pid_file)])
    for _ in range(500):
        if pid_file.is_file() and pid_file.read_text().strip() == str(gdm.pid):
            return gdm
        time.sleep(0.01)
    gdm.kill()
    raise AssertionError("fake_gdm.py wrote no pid file")


def test_a_running_desktop_is_seen_from_another_pid_namespace(tmp_path):
    pid_file = tmp_path / "desktop.pid"
    gdm = start_desktop(pid_file)
    try:
        assert seen_from_a_container(pid_file) == "True"
    finally:
        gdm.send_signal(signal.SIGTERM)
        gdm.wait()
    assert seen_from_a_container(pid_file) == "False"


def test_a_killed_desktop_is_not_seen_though_its_pid_file_stays(tmp_path):
    pid_file = tmp_path / "desktop.pid"
    gdm = start_desktop(pid_file)
    gdm.kill()
    gdm.wait()
    assert pid_file.is_file()
    assert seen_from_a_container(pid_file) == "False"
