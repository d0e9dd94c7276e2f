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


# The weights volume (roles/weights_volume in drift_roles): its read (docker_volume_info) and decision
# (module_utils/weights_volume.py, plan) are no rows; the docker_volume task is the row, and a volume that differs
# fails the role's refusal, a drifted row naming the difference.
def _volume_records(existing):
    from ansible.module_utils.weights_volume import plan

    options = {"type": "none", "o": "bind", "device": "/run/testbed/nfs/10.213.11.11/srv/models/DeepSeek-V4.1-Flash"}
    decided = plan(existing, "dsv41-weights", "local", options, False, None, "spark2")
    base = {"role": "weights_volume", "planner": False, "delegated": False, "handler": False, "item": None,
            "diff": None, "result": None, "msg": "", "changed": False, "status": "ok"}
    records = [dict(base, task="Read the weights volume (community.docker)", action="community.docker.docker_volume_info"),
               dict(base, task="Decide what to do with the weights volume", action="ansible.builtin.set_fact")]
    refuse = decided["action"] == "refuse"
    records.append(dict(base, task="Refuse to touch a weights volume that differs (nothing removed)",
                        action="ansible.builtin.fail", status="failed" if refuse else "skipped",
                        msg=decided["msg"] if refuse else ""))
    records.append(dict(base, task="Create (or, opted in, recreate) the weights volume (community.docker)",
                        action="community.docker.docker_volume", status="skipped" if refuse else "ok",
                        changed=decided["action"] == "create",
                        diff={"before": {}, "after": {"driver": "local", "driver_options": options}}
                        if decided["action"] == "create" else None))
    return decided, [r for rec_ in records for r in rows_for(rec_)]


def test_the_weights_volume_as_the_inventory_says_is_one_row_without_drift():
    existing = {"Name": "dsv41-weights", "Driver": "local", "Options": {
        "type": "none", "o": "bind", "device": "/run/testbed/nfs/10.213.11.11/srv/models/DeepSeek-V4.1-Flash"}}
    decided, rows = _volume_records(existing)
    assert decided["action"] == "none"
    assert rows == [{"item": "weights_volume Create (or, opted in, recreate) the weights volume (community.docker)",
                     "desired": "as the task states", "actual": "same", "drifted": False}]


def test_a_missing_weights_volume_drifts():
    decided, rows = _volume_records(None)
    assert decided["action"] == "create"
    (row,) = rows
    assert row["drifted"] and "driver=local" in row["desired"] and row["actual"].startswith("driver (absent)")


def test_a_weights_volume_with_other_options_drifts_naming_the_difference_with_its_own_fix():
    existing = {"Name": "dsv41-weights", "Driver": "local", "Options": {"type": "tmpfs", "device": "tmpfs"}}
    decided, rows = _volume_records(existing)
    assert decided["action"] == "refuse"
    (row,) = rows
    assert row["drifted"] and row["actual"].startswith(
        "failed: spark2: docker volume dsv41-weights exists with another driver or options than the inventory's (")
    fixes = {"weights_volume": "ansible-playbook playbooks/weights_volume.yml",
             row["item"]: "ansible-playbook playbooks/weights_volume.yml --check (names every difference)"}
    assert fix_for(row["item"], fixes).endswith("--check (names every difference)")


def test_drift_yml_has_the_weights_volume_and_a_fix_for_each_of_its_rows():
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    play = next(p for p in yaml.safe_load((root / "playbooks" / "drift.yml").read_text()) if "drift_roles" in (p.get("vars") or {}))
    roles, fixes = play["vars"]["drift_roles"], play["vars"]["drift_fixes"]
    assert roles.index("weights_volume") < roles.index("engine")
    tasks = [t["name"] for t in yaml.safe_load((root / "roles" / "weights_volume" / "tasks" / "main.yml").read_text())[1]["block"]]
    refuse = next(t for t in tasks if t.startswith("Refuse"))
    assert "weights_volume_replace=true" in fixes[f"weights_volume {refuse}"]
    assert fixes["weights_volume"] == "ansible-playbook playbooks/weights_volume.yml"
