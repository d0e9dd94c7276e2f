"""module_utils/bench_client_state.py: the one read that tells whether a host's bench client is current
(roles/bench_client skips its six install turns only then)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MU = ROOT / "module_utils"
sys.path.insert(0, str(MU))
from bench_client_state import LAUNCHER_KEY, current, digest, expected  # noqa: E402

NAMES = ["decode_client.py", "bench_stats.py", "prompt_catalog.py"]


def _launcher(venv: Path) -> str:
    return ("#!/bin/sh\n# Ansible managed\n"
            f"exec {venv}/bin/python {venv}/lib/sparkfleet-bench/decode_client.py \"$@\"\n")


def _install(venv: Path) -> str:
    """The layout roles/bench_client/tasks/install.yml makes, with a real interpreter link."""
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / "sparkfleet-bench").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")
    for name in NAMES:
        shutil.copy(MU / name, venv / "lib" / "sparkfleet-bench" / name)
    text = _launcher(venv)
    launcher = venv / "bin" / "sparkfleet-bench"
    launcher.write_text(text)
    launcher.chmod(0o755)
    return text


def _read(venv: Path) -> str:
    """The role's read: the host's Python runs this file's text with -c (as roles/bench_client/tasks/main.yml)."""
    proc = subprocess.run([sys.executable, "-c", (MU / "bench_client_state.py").read_text(), str(venv), *NAMES],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_an_installed_client_identical_to_the_controllers_is_current(tmp_path):
    venv = tmp_path / "venv"
    text = _install(venv)
    out = _read(venv)
    state = json.loads(out)
    assert state["runs"] is True and set(state["files"]) == set(NAMES) | {LAUNCHER_KEY}
    # The launcher rendered by the template module ends with a newline the lookup may not keep.
    assert current(out, expected(str(MU), NAMES, text.rstrip("\n")))


def test_a_changed_missing_or_broken_client_is_installed_again(tmp_path):
    venv = tmp_path / "venv"
    text = _install(venv)
    wanted = expected(str(MU), NAMES, text)
    client = venv / "lib" / "sparkfleet-bench" / "bench_stats.py"
    client.write_text(client.read_text() + "\n# an older copy\n")
    assert not current(_read(venv), wanted)
    client.unlink()
    state = json.loads(_read(venv))
    assert state["files"]["bench_stats.py"] is None and state["runs"] is False
    assert not current(json.dumps(state), wanted)
    shutil.copy(MU / "bench_stats.py", client)
    (venv / "bin" / "python").unlink()            # the venv's interpreter is gone: the launcher cannot run
    state = json.loads(_read(venv))
    assert state["runs"] is False and not current(json.dumps(state), wanted)
    # The launcher of another venv path differs from what the role renders for this one.
    assert not current(_read(venv), expected(str(MU), NAMES, _launcher(tmp_path / "other")))


def test_no_venv_at_all_reads_cleanly_and_is_not_current(tmp_path):
    out = _read(tmp_path / "absent")
    state = json.loads(out)
    assert state["runs"] is False and all(v is None for v in state["files"].values())
    assert not current(out, expected(str(MU), NAMES, "x"))


@pytest.mark.parametrize("stdout", ["", "not json", "[]", None, json.dumps({"python": "three", "files": {}, "runs": True})])
def test_an_unreadable_answer_is_not_current(stdout):
    assert current(stdout, {"a": "b"}) is False


def test_an_old_python_or_an_empty_expectation_is_not_current():
    files = {"a": digest("x")}
    ok = {"python": "3.9", "files": files, "runs": True}
    assert current(json.dumps(ok), files)
    assert not current(json.dumps(dict(ok, python="3.8")), files)
    assert not current(json.dumps(dict(ok, runs="yes")), files)
    assert not current(json.dumps(ok), {})


def test_digest_ignores_only_trailing_whitespace():
    assert digest("a\n") == digest(b"a") == digest("a \n\n")
    assert digest("a") != digest(" a")


def test_the_role_reads_once_and_installs_only_a_client_that_is_not_current():
    tasks = yaml.safe_load((ROOT / "roles/bench_client/tasks/main.yml").read_text())
    assert [t["name"] for t in tasks] == ["Read, and install unless current, the client (once per run and host)"]
    assert "not (_bench_client_ready" in tasks[0]["when"]
    ensure = yaml.safe_load((ROOT / "roles/bench_client/tasks/ensure.yml").read_text())
    names = [t["name"] for t in ensure]
    assert names[0].startswith("Refuse to benchmark from the head")
    read = ensure[1]
    assert "'-c', lookup('ansible.builtin.file', role_path ~ '/../../module_utils/bench_client_state.py')" in \
        read["ansible.builtin.command"]["argv"]
    assert read["check_mode"] is False and read["changed_when"] is False
    install = next(t for t in ensure if t.get("ansible.builtin.include_tasks", {}).get("file") == "once.yml")
    assert "bench_client_current" in install["when"]
    assert ensure[-1]["ansible.builtin.set_fact"] == {"_bench_client_ready": True}
    shipped = yaml.safe_load((ROOT / "roles/bench_client/tasks/install.yml").read_text())
    loop = next(t for t in shipped if t["name"] == "Ship the client from the controller")["loop"]
    assert loop == yaml.safe_load((ROOT / "roles/bench_client/vars/main.yml").read_text())["_bench_client_files"]
