"""fleet_image="x; touch MARKER #" must reach docker as one argument, never run (issue 19 item 10).

The smoke task and its vars are taken from playbooks/node_updates.yml as they are and run by ansible-playbook on
localhost, with stand-ins for nvidia-smi and docker first on PATH (docker writes its argv, one per line).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "playbooks" / "node_updates.yml"


def _smoke_play(tmp: Path, fleet_image: str) -> Path:
    canary = next(p for p in yaml.safe_load(PLAYBOOK.read_text()) if p.get("name") == "Update the canary first")
    tasks = [t for task in canary["tasks"] for t in task.get("block", [task])]   # the node's tasks sit in a block
    smoke = next(t for t in tasks if t["name"].startswith("Smoke-test this node"))
    smoke = {k: v for k, v in smoke.items() if k != "when"}
    play = [{"name": "smoke", "hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars": {**canary["vars"], "fleet_image": fleet_image, "ansible_python_interpreter": sys.executable},
             "environment": {"PATH": f"{tmp / 'bin'}:{os.environ['PATH']}"},
             "tasks": [smoke]}]
    path = tmp / "smoke.yml"
    path.write_text(yaml.safe_dump(play))
    return path


def _standins(tmp: Path) -> Path:
    (tmp / "bin").mkdir()
    (tmp / "bin" / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: stand-in'\n")
    argv = tmp / "docker-argv.json"
    (tmp / "bin" / "docker").write_text(
        f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(argv)!r}, 'w'))\nprint(42)\n")
    for name in ("nvidia-smi", "docker"):
        (tmp / "bin" / name).chmod(0o755)
    return argv


def test_fleet_image_payload_is_one_docker_argument(tmp_path):
    marker = tmp_path / "injected"
    payload = f"x; touch {marker} #"
    argv_file = _standins(tmp_path)
    play = _smoke_play(tmp_path, payload)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), SPARKFLEET_RUNS_DIR=str(tmp_path / "runs"),
               ANSIBLE_HOME=str(tmp_path / ".ansible"))
    run = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(play)],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert not marker.exists(), "the payload in fleet_image ran as shell code"
    assert run.returncode == 0, run.stdout + run.stderr
    argv = json.loads(argv_file.read_text())
    assert argv[argv.index("python3") + 1] == payload
    assert argv[-2:] == ["-c", "print(19 + 23)"]
