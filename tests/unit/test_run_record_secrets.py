"""run_record (issue 19 item 13): a secret in a recorded result is written as ********, record.json is 0600 in a
0700 run folder. A real ansible-playbook run on localhost."""
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_record_json_masks_secrets_and_is_private(tmp_path):
    play = tmp_path / "p.yml"
    play.write_text(yaml.safe_dump([{"hosts": "localhost", "connection": "local", "gather_facts": False, "tasks": [
        {"name": "Record: env", "ansible.builtin.set_fact": {"shown": {
            "HF_TOKEN": "hf_rec_secret_99", "MY_CRED": "cred_rec_77", "URL": "https://u:pw_rec_55@h/x", "A": "1"}}}]}]))
    run_dir = tmp_path / "run"
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), SPARKFLEET_RUN_DIR=str(run_dir),
               ANSIBLE_HOME=str(tmp_path / ".ansible"))
    out = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(play),
                          "-e", '{"sparkfleet_secret_env_keys": ["MY_CRED"], "ansible_python_interpreter": "'
                          + sys.executable + '"}'], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    record = run_dir / "record.json"
    text = record.read_text()
    assert "hf_rec_secret_99" not in text and "cred_rec_77" not in text and "pw_rec_55" not in text
    assert '"HF_TOKEN": "********"' in text and '"A": "1"' in text
    assert record.stat().st_mode & 0o777 == 0o600 and run_dir.stat().st_mode & 0o777 == 0o700
