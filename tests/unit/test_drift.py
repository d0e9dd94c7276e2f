"""module_utils/drift.py: the drift table from the roles' own check-mode results (issue 25 item 5)."""
from ansible.module_utils.drift import build_report, fix_for, generic_row, manages, rows_for, summarize_diff

FIXES = {"clock_lock": "ansible-playbook playbooks/site.yml --tags clock_lock",
         "headless Stop the display manager now": "ansible-playbook playbooks/site.yml --tags headless -e headless_stop_display_now=true",
         "engine": "ansible-playbook playbooks/engine.yml"}


def rec(**kw):
    base = {"role": "clock_lock", "task": "Install nvidia-clock-lock.service", "action": "template", "status": "ok",
            "changed": False, "handler": False, "planner": False, "delegated": False, "item": None, "msg": "",
            "diff": None, "result": None}
    return {**base, **kw}


UNIT_DIFF = {"before": "# Ansible managed\n[Service]\nExecStart=/usr/bin/nvidia-smi -lgc 0,1800\n",
             "after": "# Ansible managed\n[Service]\nExecStart=/usr/bin/nvidia-smi -lgc 0,2200\n",
             "before_header": "/etc/systemd/system/nvidia-clock-lock.service", "after_header": "dynamically generated"}


def test_a_task_that_would_change_is_a_drifted_row_with_the_lines_that_differ():
    row = generic_row(rec(changed=True, diff=[UNIT_DIFF]))
    assert row == {"item": "clock_lock Install nvidia-clock-lock.service", "drifted": True,
                   "desired": "ExecStart=/usr/bin/nvidia-smi -lgc 0,2200", "actual": "ExecStart=/usr/bin/nvidia-smi -lgc 0,1800"}


def test_a_converged_task_is_a_row_without_drift():
    assert generic_row(rec()) == {"item": "clock_lock Install nvidia-clock-lock.service", "desired": "as the task states",
                                  "actual": "same", "drifted": False}


def test_reads_skips_handlers_planners_and_controller_tasks_are_no_rows():
    assert generic_row(rec(action="ansible.builtin.set_fact")) is None
    assert generic_row(rec(action="fleet_snapshot_info")) is None
    assert generic_row(rec(action="boot_log_facts")) is None
    assert generic_row(rec(status="skipped", changed=False)) is None
    assert generic_row(rec(handler=True, changed=True)) is None
    assert generic_row(rec(planner=True, action="quiesce_workloads", changed=True)) is None
    assert generic_row(rec(delegated=True, changed=True)) is None
    assert generic_row(rec(action="adapter_release", state="query")) is None
    assert manages("ansible.builtin.template") and not manages("ansible.builtin.assert")


def test_a_command_is_a_row_only_when_it_would_change_something():
    assert generic_row(rec(action="command", changed=False)) is None
    row = generic_row(rec(action="ansible.builtin.command", task="Reset the GPU clocks (nvidia-smi -rgc)", changed=True))
    assert row["drifted"] and row["actual"] == "would change"


def test_a_failed_task_is_drift_with_its_message():
    row = generic_row(rec(action="assert", task="Check this rank's NCCL_IB_GID_INDEX", status="failed",
                          msg="spark2: NCCL_IB_GID_INDEX=3 is not the RoCE v2 GID\nmore"))
    assert row["drifted"] and row["actual"] == "failed: spark2: NCCL_IB_GID_INDEX=3 is not the RoCE v2 GID"


def test_a_dict_diff_shows_the_keys_that_differ_and_a_loop_item_is_named():
    row = generic_row(rec(role="headless", task="Set the default boot target to multi-user.target", action="file",
                          changed=True, item="/etc/systemd/system/default.target",
                          diff={"before": {"path": "/x", "src": "/lib/systemd/system/graphical.target"},
                                "after": {"path": "/x", "src": "/lib/systemd/system/multi-user.target"}}))
    assert row["item"] == "headless Set the default boot target to multi-user.target [/etc/systemd/system/default.target]"
    assert (row["desired"], row["actual"]) == ("src=/lib/systemd/system/multi-user.target",
                                               "src=/lib/systemd/system/graphical.target")


def test_a_new_file_is_absent_and_long_diffs_are_cut():
    shown = summarize_diff({"before": "", "after": "\n".join(f"K{i}=v" for i in range(9))})
    assert shown == {"desired": "K0=v / K1=v (+7 more lines)", "actual": "absent"}
    assert summarize_diff(None) is None and summarize_diff({"prepared": "x"}) is None


ENGINE = {"container": {"name": "dsv41-worker", "status": "running", "running": True, "image": "dsv41-3x-spark:local",
                        "image_id": "sha256:" + "a" * 64},
          "image_id": "sha256:" + "a" * 64,
          "differences": [{"what": "env", "key": "SGLANG_X", "desired": "1", "actual": None}],
          "invocation": {"module_args": {"name": "dsv41-worker", "state": "started", "image": "dsv41-3x-spark:local",
                                         "env": {"A": "1", "SGLANG_X": "1"}, "mounts": ["/a:/a", "/b:/b"]}}}


def test_the_engine_comparison_gives_state_image_env_and_mount_rows():
    rows = {r["item"]: r for r in rows_for(rec(role="engine", action="engine_container", planner=True, changed=True,
                                               result=ENGINE))}
    assert list(rows) == ["engine dsv41-worker state", "engine dsv41-worker image",
                          "engine dsv41-worker env (docker inspect)", "engine dsv41-worker mounts"]
    assert not rows["engine dsv41-worker state"]["drifted"] and not rows["engine dsv41-worker image"]["drifted"]
    env = rows["engine dsv41-worker env (docker inspect)"]
    assert env["drifted"] and env["actual"] == "differs: SGLANG_X=(absent)" and env["desired"] == "2 keys as engine_env"
    assert rows["engine dsv41-worker mounts"] == {"item": "engine dsv41-worker mounts", "desired": "2 mounts",
                                                  "actual": "same", "drifted": False}


def test_every_env_key_that_differs_is_named():
    many = {**ENGINE, "differences": [{"what": "env", "key": f"KEY_{i:02d}_LONG_NAME", "desired": "1", "actual": None}
                                      for i in range(30)]}
    env = next(r for r in rows_for(rec(role="engine", action="engine_container", planner=True, result=many))
               if r["item"].endswith("env (docker inspect)"))
    assert "KEY_29_LONG_NAME=(absent)" in env["actual"]


def test_a_stopped_engine_is_drift_and_an_absent_one_too():
    stopped = {**ENGINE, "differences": [], "container": {**ENGINE["container"], "status": "exited", "running": False}}
    rows = rows_for(rec(role="engine", action="engine_container", planner=True, result=stopped))
    assert [(r["item"], r["drifted"]) for r in rows if r["drifted"]] == [("engine dsv41-worker state", True)]
    absent = rows_for(rec(role="engine", action="engine_container", planner=True, result={**ENGINE, "container": None}))
    assert all(r["drifted"] and r["actual"] == "absent" for r in absent)


def test_the_fix_is_the_item_s_own_then_its_role_s():
    assert fix_for("headless Stop the display manager now", FIXES).endswith("headless_stop_display_now=true")
    assert fix_for("clock_lock Install x", FIXES) == FIXES["clock_lock"]
    assert fix_for("nobody x", FIXES) == "see the role of nobody x"


def test_the_report_has_a_table_per_node_the_unread_nodes_and_the_failure_message():
    records = {"spark1": [rec()], "spark2": [rec(changed=True, diff=[UNIT_DIFF])]}
    report = build_report(records, ["spark1", "spark2", "spark3"], ["spark3"], FIXES)
    assert report["drifted"] == 1 and report["unread"] == ["spark3"] and report["items"]["spark3"] is None
    assert report["items"]["spark2"][0]["fix"] == FIXES["clock_lock"]
    assert report["table"][0] == "== spark1" and "== spark3: not read (unreachable or failed)" in report["table"]
    drifted = [line for line in report["table"] if "  YES  " in line]
    assert len(drifted) == 1 and drifted[0].endswith(f"(fix: {FIXES['clock_lock']})")
    assert "spark2 clock_lock Install nvidia-clock-lock.service: ExecStart=/usr/bin/nvidia-smi -lgc 0,1800" in \
        report["failure_msg"] and "not read: spark3" in report["failure_msg"]
    clean = build_report({"spark1": [rec()]}, ["spark1"], [], FIXES)
    assert clean["drifted"] == 0 and clean["unread"] == []


def test_the_engram_plan_gives_a_row_per_shard_and_the_loaded_check_one_per_layer():
    plan = {"shards": [{"layer": 1, "state_before": "valid", "reason_before": ""},
                       {"layer": 2, "state_before": "invalid", "reason_before": "truncated"}],
            "invocation": {"module_args": {"rank": 1, "tp": 3}}}
    rows = rows_for(rec(role="engram", action="engram_pack", planner=True, result=plan))
    assert [(r["item"], r["actual"], r["drifted"]) for r in rows] == [
        ("engram l1 r1of3 shard", "valid", False), ("engram l2 r1of3 shard", "invalid (truncated)", True)]
    loaded = {"layers": [{"layer": 1, "packed": True}, {"layer": 2, "packed": False}]}
    rows = rows_for(rec(role="engram", action="engram_status_info", result=loaded))
    assert [(r["item"], r["actual"], r["drifted"]) for r in rows] == [
        ("engram l1 loaded", "packed=True", False), ("engram l2 loaded", "packed=False", True)]
    assert rows_for(rec(role="engram", action="engram_status_info",
                        result={"layers": [{"layer": 1, "packed": None}]})) == [], "no engine log: no rows"


def test_the_option_by_option_comparison_of_community_docker_is_one_row():
    # Its result is censored (no_log): the row says only whether it sees a difference the engine rows do not.
    task = "Compare every option of this rank's engine container (community.docker)"
    censored = {"censored": "the output has been hidden due to the fact that 'no_log: true' was specified"}
    drifted = rows_for(rec(role="engine", task=task, action="community.docker.docker_container", planner=True,
                           changed=True, result=censored))
    assert drifted == [{"item": "engine container options (community.docker)", "desired": "as engine_run_args",
                        "actual": "differs (playbooks/engine.yml --check names the options)", "drifted": True}]
    same = rows_for(rec(role="engine", task=task, action="community.docker.docker_container", planner=True,
                        result=censored))
    assert same[0]["actual"] == "same" and not same[0]["drifted"]
    # A stop (not a planner) is an ordinary row.
    stop = rows_for(rec(role="engine", task="Stop this rank's engine", action="community.docker.docker_container",
                        changed=True))
    assert stop == [{"item": "engine Stop this rank's engine", "desired": "as the task states",
                     "actual": "would change", "drifted": True}]
