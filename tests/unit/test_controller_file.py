"""plugins/action/controller_file.py in a real localhost play: it writes the run folder's files on the controller
without a module, the same bytes and mode as ansible.builtin.copy, truthfully in check mode and idempotent."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Write with controller_file
      controller_file:
        dest: "{{ dest }}"
        %s
      register: out
    - name: Keep the result for the test
      ansible.builtin.copy:
        dest: "{{ result_file }}"
        content: "{{ out | to_json }}"
        mode: "0644"
      check_mode: false
      diff: false
"""
WRITE = ("content: \"{{ {'ranks': [0, 1, 2], 'text': 'ready ✓'} | to_nice_json }}\"\n"
         '        mode: "0640"')


def run_play(tmp_path: Path, dest: Path, *extra: str, args: str = WRITE) -> subprocess.CompletedProcess:
    (tmp_path / "play.yml").write_text(PLAY % args)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_HOME=str(tmp_path / ".ansible"),
               SPARKFLEET_RUNS_DIR=str(tmp_path / "runs"), ANSIBLE_NOCOLOR="1", SPARKFLEET_RUN_DIR=str(tmp_path / "run"),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    (tmp_path / "run").mkdir(exist_ok=True)
    return subprocess.run(["ansible-playbook", "-i", "localhost,", str(tmp_path / "play.yml"), "-e", f"dest={dest}",
                           "-e", f"result_file={tmp_path / 'result.json'}",
                           "-e", f"ansible_python_interpreter={sys.executable}", *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True)


def play(tmp_path: Path, dest: Path, *extra: str, args: str = WRITE) -> dict:
    proc = run_play(tmp_path, dest, *extra, args=args)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads((tmp_path / "result.json").read_text())


def test_writes_the_file_like_copy_then_changes_nothing_and_check_mode_writes_nothing(tmp_path):
    dest = tmp_path / "rollout.json"
    checked = play(tmp_path, dest, "--check")
    assert checked["changed"] is True and not dest.exists(), "check mode reports the change and writes nothing"
    first = play(tmp_path, dest)
    assert first["changed"] is True
    assert json.loads(dest.read_text()) == {"ranks": [0, 1, 2], "text": "ready ✓"}
    assert stat.S_IMODE(dest.stat().st_mode) == 0o640
    assert play(tmp_path, dest)["changed"] is False, "a second run with the same content changes nothing"


def test_diff_mode_shows_what_changes_like_copy(tmp_path):
    """--diff shows the old and new text (as ansible.builtin.copy does); a file above Ansible's diff size limit is
    named, not printed."""
    dest = tmp_path / "rollout.json"
    dest.write_text("old text\n")
    out = play(tmp_path, dest, "--check", "--diff")
    assert out["changed"] is True and dest.read_text() == "old text\n"
    diff = out["diff"]
    assert diff["before"] == "old text\n" and '"ready' in diff["after"], diff
    assert diff["before_header"] == diff["after_header"] == str(dest)
    missing = tmp_path / "new.json"
    assert play(tmp_path, missing, "--diff")["diff"]["before"] == ""
    assert "diff" not in play(tmp_path, missing), "no diff without --diff"


MAKE_FOLDERS = """content: "boot log\\n"
        make_folders: true"""


def test_make_folders_makes_the_missing_folders_and_nothing_in_check_mode(tmp_path):
    """make_folders: a rollout's boot-logs/<phase> folders are made with the first log written into them (0755 each,
    whatever the umask), as the file task before it did; in check mode the change is reported and nothing is made."""
    dest = tmp_path / "run" / "boot-logs" / "candidate" / "spark1.log"
    assert play(tmp_path, dest, "--check", args=MAKE_FOLDERS)["changed"] is True
    assert not (tmp_path / "run" / "boot-logs").exists(), "check mode makes no folder"
    old = os.umask(0o077)
    try:
        assert play(tmp_path, dest, args=MAKE_FOLDERS)["changed"] is True
    finally:
        os.umask(old)
    assert dest.read_text() == "boot log\n"
    assert stat.S_IMODE(dest.parent.stat().st_mode) == 0o755
    assert stat.S_IMODE(dest.parent.parent.stat().st_mode) == 0o755
    assert play(tmp_path, dest, args=MAKE_FOLDERS)["changed"] is False
    missing = run_play(tmp_path, tmp_path / "run" / "other" / "x.json")
    assert missing.returncode != 0 and "does not exist" in missing.stdout, "without make_folders it stays an error"
