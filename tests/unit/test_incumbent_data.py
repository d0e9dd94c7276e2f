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



def _ansible_env(tmp_path) -> dict:
    """The environment a test's ansible-playbook runs with: the project's config, roles and filters."""
    return {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "SPARKFLEET_RUNS_DIR": str(tmp_path / "runs"),
            "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_FILTER_PLUGINS": str(ROOT / "plugins" / "filter")}

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
    env, bin_dir = _ansible_env(tmp_path), Path(sys.executable).parent
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


def test_a_second_keep_rewrites_the_incumbent_the_first_one_wrote(tmp_path):
    """The combination kept after keep_best (6-rung campaign, 2026-12-04) rewrote an incumbent file the rollout
    had written: ansible-core reads `!unsafe '20'` back as an int, and to_data_yaml failed ("cannot represent an
    object", 20). Strings that YAML would read as another type (numbers, booleans) are written quoted without the
    tag (they cannot hold a template), so they come back as the same strings; an older file's tagged numbers
    are written as numbers instead of failing."""
    inv = tmp_path / "inventory"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
                                   "      ansible_python_interpreter: " + sys.executable + "\n")
    incumbent = inv / "group_vars" / "all" / "incumbent.yml"
    incumbent.write_text(data_yaml({"engine_env_incumbent": {"SIM_RENDEZVOUS_TIMEOUT_S": "20", "SIM_TIME_SCALE": "0.25",
                                                             "FLAG": "true", "CAP": "conf:0.1"},
                                    "engine_env_incumbent_unset": [], "incumbent_experiments": ["a"]}))
    old = inv / "group_vars" / "all" / "old.yml"       # as an earlier version wrote it: every string tagged
    old.write_text("old_env:\n  N: !unsafe '7'\n")
    keep = _playbook(tmp_path, "keep.yml", f"""
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Lay a kept change over the incumbent, as roles/rollout keep.yml does
      ansible.builtin.include_role:
        name: rollout
        tasks_from: write_incumbent
      vars:
        rollout_incumbent_file: {inv / 'group_vars' / 'all' / 'incumbent.yml'}
        _rollout_incumbent_note: second keep
        _rollout_incumbent:
          incumbent_experiments: "{{{{ (incumbent_experiments + ['b']) | unique }}}}"
          engine_env_incumbent: "{{{{ engine_env_incumbent | combine(old_env) | combine({{'NEW': '1'}}) }}}}"
          engine_env_incumbent_unset: []
    - name: Read the values back as the next play does
      ansible.builtin.copy:
        dest: "{{{{ out }}}}"
        content: "{{{{ engine_env_incumbent | to_json }}}}"
        mode: "0644"
""")
    env, bin_dir = _ansible_env(tmp_path), Path(sys.executable).parent
    run = subprocess.run([str(bin_dir / "ansible-playbook"), "-i", str(inv), str(keep), "-e", f"out={tmp_path / 'before.txt'}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    written = yaml.safe_load(incumbent.read_text().replace("!unsafe ", ""))
    assert written["engine_env_incumbent"] == {"SIM_RENDEZVOUS_TIMEOUT_S": "20", "SIM_TIME_SCALE": "0.25", "FLAG": "true",
                                               "CAP": "conf:0.1", "N": 7, "NEW": "1"}
    assert written["incumbent_experiments"] == ["a", "b"]
