"""A campaign's record.json (issue 23; plugins/callback/run_record.py) carries each rung's campaign_step
decisions and what its nested run returned, secrets masked, without the ~20 s progress steps. A real
ansible-playbook run on localhost calling the real module on the 3-rung fixture plan."""
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "tests" / "integration" / "fixtures" / "campaigns" / "testbed-3.yml"


def run_local_play(tmp_path, tasks, run_dir):
    """Run `tasks` as one localhost play through the project's ansible.cfg (its run_record callback writes
    run_dir/record.json); the play must succeed."""
    play = tmp_path / "p.yml"
    play.write_text(yaml.safe_dump([{"hosts": "localhost", "connection": "local", "gather_facts": False,
                                     "tasks": tasks}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), SPARKFLEET_RUN_DIR=str(run_dir),
               ANSIBLE_HOME=str(tmp_path / ".ansible"))
    out = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(play),
                          "-e", '{"ansible_python_interpreter": "' + sys.executable + '"}'],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def test_record_json_holds_the_rungs_nested_results_masked_and_no_progress_steps(tmp_path):
    campaign = tmp_path / "campaign"
    done = tmp_path / "job-result.json"
    done.write_text(json.dumps({"rc": 2, "finished": 1}))
    common = {"run_dir": str(campaign), "catalog": str(ROOT / "experiments")}
    nested = {"rc": 2, "status": "failed", "ok": False, "elapsed_s": 12.5, "stats": {"failures": {"spark2": 1}},
              "failures": [{"host": "spark2", "task": "Boot", "msg": "env HF_TOKEN=hf_nested_secret_42 rejected"}],
              "stdout_tail": "long output"}
    tasks = [
        {"name": "Init", "campaign_step": dict(common, action="init", plan=str(PLAN), window_end="2h")},
        {"name": "Next", "campaign_step": dict(common, action="next"), "register": "nxt"},
        {"name": "Start", "campaign_step": dict(common, action="start", rung="{{ nxt.step.rung }}",
                                                step="{{ nxt.step }}")},
        {"name": "Progress", "campaign_step": dict(common, action="progress", rung="{{ nxt.step.rung }}",
                                                   results_file=str(done), interval_s=1)},
        {"name": "Finish", "campaign_step": dict(common, action="finish", rung="{{ nxt.step.rung }}",
                                                 nested=nested)},
    ]
    run_dir = tmp_path / "run"
    run_local_play(tmp_path, tasks, run_dir)
    record = json.loads((run_dir / "record.json").read_text())
    steps = [r for r in record["results"] if r["module"] == "campaign_step"]
    assert [r["result"]["action"] for r in steps] == ["init", "next", "start", "finish"]
    finish = steps[-1]["result"]
    assert finish["rung"]["id"] == "01-pack_engram" and finish["rung"]["nested_s"] == 12.5
    assert finish["nested"]["rc"] == 2 and finish["nested"]["stats"] == {"failures": {"spark2": 1}}
    assert "stdout_tail" not in finish["nested"]
    text = (run_dir / "record.json").read_text()
    assert "hf_nested_secret_42" not in text and "HF_TOKEN=********" in text


def test_a_failed_step_is_recorded_and_the_report_written_without_the_plan_file(tmp_path):
    """The rescue of campaign.yml's rung loop, as module calls: a rung starts, its plan file is removed, the
    next `next` fails (it reads the plan); `abort` records the failure and the running rung, and `report`
    writes REPORT.md from the plan the state recorded (the file is gone)."""
    plan = tmp_path / "plan.yml"
    plan.write_text(PLAN.read_text())
    campaign = tmp_path / "campaign"
    common = {"run_dir": str(campaign), "catalog": str(ROOT / "experiments")}
    tasks = [
        {"name": "Init", "campaign_step": dict(common, action="init", plan=str(plan), window_end="2h")},
        {"name": "Next", "campaign_step": dict(common, action="next"), "register": "nxt"},
        {"name": "Start", "campaign_step": dict(common, action="start", rung="{{ nxt.step.rung }}", step="{{ nxt.step }}")},
        {"name": "Remove the plan", "ansible.builtin.file": {"path": str(plan), "state": "absent"}},
        {"name": "Steps", "block": [{"name": "What now", "campaign_step": dict(common, action="next")}],
         "rescue": [{"name": "Abort", "campaign_step": dict(common, action="abort",
                                                            reason="'{{ ansible_failed_task.name }}': {{ ansible_failed_result.msg }}"),
                     "register": "aborted"}]},
        {"name": "Report", "campaign_step": dict(common, action="report"), "register": "rep"},
        {"name": "Show", "ansible.builtin.debug": {"msg": "{{ aborted.ended }} {{ rep.summary }}"}},
    ]
    run_local_play(tmp_path, tasks, tmp_path / "run")
    state = json.loads((campaign / "campaign-state.json").read_text())
    assert state["stopped"]["fleet_failure"] and "'What now': " in state["stopped"]["reason"]
    assert "cannot read the plan file" in state["stopped"]["reason"]
    assert [(r["status"], r.get("outcome")) for r in state["rungs"]][:2] == [("done", "failed"), ("not_reached", None)]
    report = (campaign / "REPORT.md").read_text()
    assert "**Stopped early**: a step of the campaign failed: 'What now': cannot read the plan file" in report
    assert "| 01-pack_engram | A | pack_engram |" in report and "- 02-folded_fence folded_fence: a step of the campaign" in report
