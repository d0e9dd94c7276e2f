"""nested_play: a real nested ansible-playbook through ansible-runner, its result as data."""
import json
import os
import sys

from ansible.module_utils.nested_play import command_line, progress, run

os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Say what I was given
      ansible.builtin.debug:
        msg: "{{ greeting }} {{ name }} from {{ lookup('ansible.builtin.env', 'SPARKFLEET_RUN_DIR') }}"
    - name: Fail when told to
      ansible.builtin.fail:
        msg: "told to fail: {{ name }}"
      when: fail_now | default(false) | bool
"""


def test_a_nested_play_gets_the_callers_extra_vars_and_returns_its_result_as_data(tmp_path):
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "vars.json").write_text(json.dumps({"name": "spark2"}))
    out = run(str(tmp_path / "play.yml"), str(tmp_path / "runner"), inventory=["localhost,"],
              extra_vars={"greeting": "hello"}, extra_vars_files=[str(tmp_path / "vars.json")],
              env={"SPARKFLEET_RUN_DIR": str(tmp_path / "rec")})
    assert out["rc"] == 0 and out["ok"] and out["failures"] == [], out
    assert f"hello spark2 from {tmp_path / 'rec'}" in out["stdout_tail"]
    assert out["stats"]["ok"] == {"localhost": 1}
    assert progress(str(tmp_path / "runner"))["events"] > 0
    (tmp_path / "vars.json").write_text(json.dumps({"name": "spark3", "fail_now": True}))
    bad = run(str(tmp_path / "play.yml"), str(tmp_path / "runner2"), inventory=["localhost,"],
              extra_vars={"greeting": "hi"}, extra_vars_files=[str(tmp_path / "vars.json")])
    assert bad["rc"] != 0 and not bad["ok"]
    assert bad["failures"] == [{"host": "localhost", "task": "Fail when told to", "msg": "told to fail: spark3"}]


def test_the_command_line_quotes_every_value():
    assert command_line(["/a b/v.json"], ["/p w"], tags=["clock_lock", "x"]) == \
        "-e '@/a b/v.json' --vault-password-file '/p w' --tags clock_lock,x"


def test_a_nested_play_inside_an_ansible_runner_run_keeps_its_own_display(tmp_path, monkeypatch):
    """A rollout run by ansible-runner (the integration tests, a campaign rung) runs its host change through
    nested_play: the inherited ANSIBLE_STDOUT_CALLBACK=awx_display made the inner run's display load itself
    ("awx_display has no attribute CallbackModule", rc 250; seen in test_rollout's failed-apply test)."""
    monkeypatch.setenv("ANSIBLE_STDOUT_CALLBACK", "awx_display")
    monkeypatch.setenv("ORIGINAL_STDOUT_CALLBACK", "default")
    (tmp_path / "play.yml").write_text(PLAY)
    out = run(str(tmp_path / "play.yml"), str(tmp_path / "runner"), inventory=["localhost,"],
              extra_vars={"greeting": "hello", "name": "spark1"})
    assert out["rc"] == 0, out["stdout_tail"]
    assert "hello spark1" in out["stdout_tail"]


def test_progress_reads_past_the_partial_event_ansible_runner_is_writing(tmp_path):
    """ansible-runner writes <uuid>-partial.json beside <counter>-<uuid>.json while an event is in flight; the
    campaign's progress step failed on it ("invalid literal for int() with base 10: '02fc0000'")."""
    events = tmp_path / "runner" / "artifacts" / "nested" / "job_events"
    events.mkdir(parents=True)
    (events / "1-aaaa.json").write_text(json.dumps({"event_data": {"task": "Boot", "host": "spark1", "play": "p"}}))
    (events / "2-bbbb.json").write_text(json.dumps({"event_data": {"task": "Bench", "host": "spark3", "play": "p"}}))
    (events / "02fc0000-1111-2222-3333-444455556666-partial.json").write_text("{}")
    assert progress(str(tmp_path / "runner")) == {"task": "Bench", "host": "spark3", "play": "p", "events": 2}
