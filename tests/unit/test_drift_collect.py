"""drift_collect + drift_report_info (issue 25 item 5): a real ansible-playbook run on localhost, a role's own
tasks in check mode, the table built from what they would change. Secrets in a diff are masked."""
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_a_role_s_check_mode_results_become_the_drift_rows(tmp_path):
    role = tmp_path / "roles" / "demo" / "tasks"
    role.mkdir(parents=True)
    wrong, right = tmp_path / "wrong.env", tmp_path / "right.env"
    wrong.write_text("A=2\nHF_TOKEN=hf_drift_secret_42\n")
    right.write_text("B=1\n")
    (role / "main.yml").write_text(yaml.safe_dump([
        {"name": "Read something", "ansible.builtin.stat": {"path": str(wrong)}},
        {"name": "Write the wrong file", "ansible.builtin.copy": {
            "dest": str(wrong), "content": "A=1\nHF_TOKEN=hf_drift_secret_43\n", "mode": "0644"}},
        {"name": "Write the right file", "ansible.builtin.copy": {"dest": str(right), "content": "B=1\n"}},
        {"name": "Only when needed", "ansible.builtin.copy": {"dest": str(right), "content": "x"}, "when": False},
        # A role's guard for real runs: in the drift play (check_mode: true, no --check) it must hold as with --check.
        {"name": "Only for real", "ansible.builtin.copy": {"dest": str(right), "content": "y"},
         "when": "not ansible_check_mode"},
    ]))
    out_file = tmp_path / "report.json"
    play = tmp_path / "p.yml"
    play.write_text(yaml.safe_dump([{
        "hosts": "localhost", "connection": "local", "gather_facts": False, "check_mode": True, "diff": True,
        "vars": {"drift_collect": True}, "tasks": [
            {"name": "Run the role", "ansible.builtin.include_role": {"name": "demo"}},
            {"name": "Build", "drift_report_info": {
                "record": "{{ lookup('ansible.builtin.env', 'SPARKFLEET_DRIFT_RECORD') }}", "nodes": ["localhost"],
                "fixes": {"demo": "ansible-playbook fix.yml"}}, "register": "report"},
            {"name": "Keep", "ansible.builtin.copy": {"dest": str(out_file), "content": "{{ report | to_json }}"},
             "check_mode": False}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), SPARKFLEET_RUN_DIR=str(tmp_path / "run"),
               ANSIBLE_ROLES_PATH=str(tmp_path / "roles"), ANSIBLE_HOME=str(tmp_path / ".ansible"))
    env.pop("SPARKFLEET_DRIFT_RECORD", None)
    run = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(play),
                          "-e", '{"ansible_python_interpreter": "' + sys.executable + '"}'],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out_file.read_text())
    rows = {r["item"]: r for r in report["items"]["localhost"]}
    assert list(rows) == ["demo Write the wrong file", "demo Write the right file"], "reads and skipped tasks are no rows"
    assert rows["demo Write the wrong file"]["drifted"] and rows["demo Write the wrong file"]["desired"].startswith("A=1")
    assert rows["demo Write the wrong file"]["actual"].startswith("A=2")
    assert rows["demo Write the wrong file"]["fix"] == "ansible-playbook fix.yml"
    assert not rows["demo Write the right file"]["drifted"] and report["drifted"] == 1
    assert wrong.read_text().startswith("A=2"), "check mode changed nothing"
    record = Path(tmp_path / "run" / "drift-tasks.json")
    assert record.stat().st_mode & 0o777 == 0o600
    assert "hf_drift_secret" not in record.read_text() and "hf_drift_secret" not in out_file.read_text()
