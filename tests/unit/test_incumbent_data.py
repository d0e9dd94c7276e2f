"""Issue 19 item 11: values the rollout writes back into group_vars (the incumbent file) stay data.

Runs the rollout role's real writer (roles/rollout/tasks/write_incumbent.yml) with ansible-playbook on
localhost, then a second play that loads the written file as group_vars and uses the values, as the next
engine converge does; the payload must come back verbatim and its command must never run."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "module_utils"))
from experiments import data_yaml  # noqa: E402


def _playbook(tmp: Path, name: str, text: str) -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def test_an_env_value_with_a_lookup_is_written_and_read_back_as_data(tmp_path):
    marker = Path("/tmp") / f"sparkfleet-unsafe-{uuid.uuid4().hex}"
    payload = "{{ lookup('pipe', 'touch " + str(marker) + "') }}"
    inv = tmp_path / "inventory"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
                                   "      ansible_python_interpreter: " + sys.executable + "\n")
    # As experiment_load_info returns it: a value the controller must not trust (module results are untrusted).
    (tmp_path / "vars.yml").write_text("payload: !unsafe " + yaml.safe_dump(payload, default_style="'"))
    write = _playbook(tmp_path, "write.yml", f"""
- hosts: localhost
  gather_facts: false
  vars_files: [{tmp_path / 'vars.yml'}]
  tasks:
    - name: Build an incumbent from untrusted data (as a kept experiment's env)
      ansible.builtin.set_fact:
        _rollout_incumbent:
          incumbent_experiments: [x]
          engine_env_incumbent: "{{{{ {{'EVIL': payload, 'N': 3}} }}}}"
          engine_env_incumbent_unset: []
    - name: Write it
      ansible.builtin.include_role:
        name: rollout
        tasks_from: write_incumbent
      vars:
        rollout_incumbent_file: {inv / 'group_vars' / 'all' / 'incumbent.yml'}
        _rollout_incumbent_note: test
""")
    use = _playbook(tmp_path, "use.yml", """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Use the value as the engine_env role does
      ansible.builtin.copy:
        dest: "{{ out }}"
        content: "{{ engine_env_incumbent.EVIL }}|{{ engine_env_incumbent | to_json }}"
        mode: "0644"
""")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "SPARKFLEET_RUNS_DIR": str(tmp_path / "runs"),
           "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_FILTER_PLUGINS": str(ROOT / "plugins" / "filter")}
    bin_dir = Path(sys.executable).parent
    try:
        for book, extra in ((write, []), (use, ["-e", f"out={tmp_path / 'used.txt'}"])):
            run = subprocess.run([str(bin_dir / "ansible-playbook"), "-i", str(inv), str(book), *extra],
                                 cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
            assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
        assert not marker.exists(), "the payload ran on the controller"
        used = (tmp_path / "used.txt").read_text()
        assert used.split("|")[0] == payload
        assert "!unsafe" in (inv / "group_vars" / "all" / "incumbent.yml").read_text()
    finally:
        marker.unlink(missing_ok=True)


def test_data_yaml_tags_every_string_and_keeps_numbers_and_keys():
    text = data_yaml({"engine_env_incumbent": {"A": "{{ x }}", "N": 3}, "incumbent_experiments": ["w8"]}, "note")
    assert text.startswith("# note\n")
    assert "A: !unsafe '{{ x }}'" in text and "N: 3" in text and "- !unsafe 'w8'" in text
