"""The node preflight on the testbed (issue 10): a clean seed fleet passes; each failure knob fails exactly one
check on the right host, naming the fix; a wedged node stops the run and nothing is restarted; bad input is
refused before any host is touched; the parity table is in the run record."""
from __future__ import annotations

import json

import pytest

from tests.integration.conftest import ensure_testbed, fleet, run_playbook

pytestmark = pytest.mark.testbed


def up_with(*knobs: str) -> None:
    fleet("down")
    fleet("up", *[arg for knob in knobs for arg in ("--knob", knob)])


@pytest.fixture(scope="module", autouse=True)
def plain_seed_afterwards():
    yield
    # Knobs leave a seed testbed that ensure_testbed cannot tell from a plain one: leave a plain seed up for the
    # session-wide `testbed` fixture of later modules.
    fleet("down")
    fleet("up")


def node_results(run) -> dict:
    """host -> node_preflight_info result (from the run record, like an operator would read it)."""
    return {r["host"]: r["result"] for r in run.record()["results"] if r["module"] == "node_preflight_info"}


def failed_checks(run) -> dict:
    return {host: result["failed_checks"] for host, result in node_results(run).items()}


def check(result: dict, name: str) -> dict:
    return next(c for c in result["checks"] if c["name"] == name)


def parity(run) -> dict:
    rec = [r for r in run.record()["results"] if r["task"].endswith("Record: fleet parity")]
    assert len(rec) == 1
    return rec[0]["result"]["ansible_facts"]["preflight_parity"]


def test_a_clean_seed_fleet_passes(fresh_testbed):
    run = run_playbook("preflight.yml")
    assert run.rc == 0, run.stdout[-3000:]
    results = node_results(run)
    assert set(results) == {"spark1", "spark2", "spark3"}
    for host, result in results.items():
        assert result["verdict"] == "start" and result["failed_checks"] == [], (host, result["lines"])
        assert check(result, "gid")["facts"]["gid_index"] == 3
    table = parity(run)
    assert table["differences"] == [] and table["hosts"] == ["spark1", "spark2", "spark3"]
    assert {row["key"] for row in table["rows"]} >= {"kernel", "driver", "firmware", "nccl", "swap", "clocks",
                                                      "fragmentation", "gid_index"}
    assert run.changed() == []


def test_every_entry_playbook_runs_it_after_the_inventory_validation_and_skip_is_recorded(testbed):
    # (The seed's spark2 lacks the space to pack: the plan refuses afterwards, which does not matter here.)
    run = run_playbook("pack_engram.yml", check=True)
    assert {h: r["verdict"] for h, r in node_results(run).items()} == dict.fromkeys(("spark1", "spark2", "spark3"),
                                                                                  "start")
    tasks = [e["event_data"]["task"] for e in run.events if e.get("event") == "playbook_on_task_start"]
    validate = tasks.index("Check ranks, roles and the number of hosts against the tensor-parallel size")
    assert validate < tasks.index("Preflight this node (read-only)") < tasks.index("Plan this rank")
    skipped = run_playbook("pack_engram.yml", check=True, extravars={"preflight_skip": True})
    assert "Plan this rank" in [e.get("event_data", {}).get("task") for e in skipped.events]
    assert node_results(skipped) == {}
    notes = [r for r in skipped.record()["results"] if "Record: preflight skipped" in r["task"]]
    assert len(notes) == 1 and "skipped" in notes[0]["result"]["msg"]


def test_knobs_each_fail_exactly_one_check_on_their_host_naming_the_fix(testbed):
    up_with("spark2:no_kho", "spark3:fragmented")
    run = run_playbook("preflight.yml")
    assert run.rc != 0
    assert failed_checks(run) == {"spark1": [], "spark2": ["kho"], "spark3": ["fragmentation"]}
    results = node_results(run)
    assert "kho=off" in check(results["spark2"], "kho")["fix"]
    assert results["spark3"]["verdict"] == "reboot first"
    assert "reboot" in check(results["spark3"], "fragmentation")["fix"]
    assert "spark2: FIX FIRST: kho: FAIL" in run.stdout and "spark3: REBOOT FIRST: fragmentation: FAIL" in run.stdout

    up_with("spark3:mtu1500", "spark2:gid_moved")
    run = run_playbook("preflight.yml")
    assert run.rc != 0
    assert failed_checks(run) == {"spark1": [], "spark2": [], "spark3": ["fabric"]}
    fabric = check(node_results(run)["spark3"], "fabric")
    assert "eth0 has MTU 1500, not 9000" in fabric["summary"] and "mtu 9000" in fabric["fix"]
    # The moved GID index is resolved on spark2 and reported as a parity difference on spark2 only (this run
    # needs no parity, so it is not a failure here).
    assert check(node_results(run)["spark2"], "gid")["facts"]["gid_index"] == 5
    assert [(d["key"], list(d["hosts"])) for d in parity(run)["differences"]] == [("gid_index", ["spark2"])]
    assert parity(run)["notes"] == []


def test_differing_gid_indices_fail_parity_unless_declared_per_node(testbed):
    # By default a moved index stops a benchmark or a rollout, naming the node and the fix; a fleet whose indices
    # differ by design (each rank's engine uses its own node's: engine_env_nccl_gid: resolved) declares them per node.
    up_with("spark2:gid_moved")
    strict = run_playbook("preflight.yml", extravars={"preflight_parity_required": True})
    assert strict.rc != 0
    assert failed_checks(strict) == {"spark1": [], "spark2": [], "spark3": []}
    assert "Fleet parity: gid_index differs on spark2 (rocep1s0f0:5) from rocep1s0f0:3 on spark1, spark3" in strict.stdout
    assert "preflight_parity_per_node_keys" in strict.stdout  # the fix names the switch
    per_node = run_playbook("preflight.yml", extravars={"preflight_parity_required": True,
                                                        "preflight_parity_per_node_keys": ["gid_index"]})
    assert per_node.rc == 0, per_node.stdout[-2000:]
    assert "PER NODE (expected, not a difference): gid_index differs on spark2 (rocep1s0f0:5)" in per_node.stdout
    pinned = run_playbook("preflight.yml", extravars={"preflight_gid_index_pin": 3})
    assert failed_checks(pinned) == {"spark1": [], "spark2": ["gid"], "spark3": []}


def test_a_wedged_node_stops_the_run_and_nothing_is_restarted(testbed, host):
    up_with("spark2:wedge")
    before = host("spark2").check_output("docker ps -a --format '{{.Names}} {{.Status}}'")
    run = run_playbook("site.yml")
    assert run.rc != 0
    assert failed_checks(run) == {"spark1": [], "spark2": ["kernel_log"], "spark3": []}
    failure = [f for f in run.record()["failures"] if f["host"] == "spark2"]
    assert failure and failure[0]["msg"].startswith("spark2: POWER CYCLE NEEDED: kernel_log: FAIL:")
    assert "Nothing restarts this node automatically" in failure[0]["msg"]
    # The run stopped at the preflight: no later task ran on any node, nothing changed anywhere.
    assert run.changed() == []
    assert not run.results(module="ping")
    assert host("spark2").check_output("docker ps -a --format '{{.Names}} {{.Status}}'") == before


def test_bad_input_is_refused_before_any_host_is_touched(testbed):
    ensure_testbed()
    run = run_playbook("preflight.yml", extravars={"preflight_allowed_kernels": []})
    assert run.rc != 0
    assert "refusing to run the preflight: preflight_allowed_kernels is empty" in run.stdout
    assert not run.results(module="node_preflight_info")
    run = run_playbook("preflight.yml", extravars={"preflight_allowed_drivers": []})
    assert "preflight_allowed_drivers is empty" in run.stdout
    run = run_playbook("preflight.yml", extravars={"preflight_hcas": ["mlx5_9"]})
    assert run.rc != 0 and "unknown HCA mlx5_9" in run.stdout and "rocep1s0f0, rocep1s0f1" in run.stdout
    run = run_playbook("preflight.yml", limit="spark3", extravars={"fleet_fabric_address": "10.213.99.13"})
    assert run.rc != 0
    assert "no interface holds the fabric address 10.213.99.13" in json.dumps(node_results(run)["spark3"])


# ------------------------------------------------------------------ node_updates.yml (canary first)

def _update_log(host, name: str) -> str:
    return host(name).run("cat /var/lib/testbed/apt-upgrade.log 2>/dev/null").stdout.strip()


def _holds(host, name: str) -> list:
    return host(name).check_output("apt-mark showhold").split()


def test_node_updates_check_mode_shows_the_plan_and_changes_nothing(testbed, host):
    ensure_testbed()
    fleet("down")
    fleet("up")
    run = run_playbook("node_updates.yml", check=True, extravars={"node_updates_canary": "spark2"})
    assert run.rc == 0, run.stdout[-2000:]
    plan = run.results(task="Show the plan")[0]["msg"]
    assert plan[0].startswith("1. canary spark2: stop its engine, upgrade")
    assert plan[1] == "2. then one at a time, stopping at the first failure: spark1, spark3"
    would = [r["msg"] for r in run.results(task="Show the holds check mode would change") if r.get("msg")]
    assert would and "would hold linux-firmware, linux-image-7.0.0-1019-nvidia" in would[0]
    for name in ("spark1", "spark2", "spark3"):
        assert _update_log(host, name) == "" and _holds(host, name) == []


def test_a_failing_canary_leaves_the_other_nodes_untouched(testbed, host):
    run = run_playbook("node_updates.yml", extravars={
        "node_updates_canary": "spark2",
        "node_updates_upgrade_command": "sh -c 'echo E: Sub-process /usr/bin/dpkg returned an error code (1) >&2; exit 100'"})
    assert run.rc != 0
    failures = run.record()["failures"]
    # the upgrade's own failure (rescued), then the stop with the fleet's state: both on the canary only
    assert [f["host"] for f in failures] == ["spark2", "spark2"], failures
    assert failures[0]["task"] == "Upgrade this node"
    assert "node_updates STOPPED at spark2" in failures[-1]["msg"] and "Not updated: spark1, spark3" in failures[-1]["msg"]
    touched = {h for h, _ in run.changed()}
    assert touched == {"spark2"}, run.changed()
    assert _holds(host, "spark2")    # the canary got as far as holding its packages
    for name in ("spark1", "spark3"):
        assert _update_log(host, name) == "" and _holds(host, name) == []


def test_node_updates_roll_canary_first_then_one_at_a_time_and_record_versions(testbed, host):
    fleet("down")
    fleet("up")
    run = run_playbook("node_updates.yml", extravars={"node_updates_canary": "spark3"})
    assert run.rc == 0, run.stdout[-2000:]
    upgrades = [r["_host"] for r in run.results(task="Upgrade this node") if r["_event"] == "runner_on_ok"]
    assert upgrades == ["spark3", "spark1", "spark2"]
    records = {r["host"]: r["result"]["ansible_facts"]["node_updates_result"]
               for r in run.record()["results"] if r["task"] == "Record: node update"}
    assert set(records) == {"spark1", "spark2", "spark3"}
    for name, rec in records.items():
        assert rec["packages"]["linux-image-7.0.0-1019-nvidia"] == "7.0.0-1019.19"
        assert "nvidia-driver-580-open" in rec["held"] and rec["preflight"] == "start" and rec["smoke"] == "42"
        assert _update_log(host, name) != ""
    again = run_playbook("node_updates.yml", extravars={"node_updates_canary": "spark3"})
    assert again.rc == 0 and again.changed() == []
