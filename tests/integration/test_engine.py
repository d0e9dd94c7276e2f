"""playbooks/engine.yml (roles engine_env and engine) and the engine rows of playbooks/drift.yml on the testbed:
one serving env reaching every rank, ordered boots, logs kept, failures named, bad input refused early."""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
import testinfra
import yaml

from tests.integration.conftest import ROOT, ensure_testbed, play, state_dir

# This module's playbooks use their own run folders and the testbed inventory without incumbent.yml
# (tests/integration/conftest.py: isolated_inventory, play).
pytestmark = [pytest.mark.testbed, pytest.mark.usefixtures("isolated_inventory")]

HOSTS = {"spark1": (0, "dsv41-head", "/home/mia/dsv41-3x-spark"),
         "spark2": (1, "dsv41-worker", "/home/zurih/dsv41-3x-spark"),
         "spark3": (2, "dsv41-worker", "/home/zurih/dsv41-3x-spark")}
SWITCH = ("DSV41_ENGRAM_PREFETCH", "1")
# These tests exercise the engine plays; the node preflight that every entry playbook imports has its own tests.
BASE = {"preflight_skip": True}
# Tasks that run on the controller only: a run of nothing but these has not touched a host.
CONTROLLER_ONLY = {"assert", "validate_argument_spec", "debug", "set_fact", "include_role", "include_tasks", "fail"}


def serving_env(**extra: str) -> dict:
    env = yaml.safe_load((ROOT / "inventory/testbed/group_vars/all/engine.yml").read_text())["engine_env"]
    env.update(extra)
    return env


def with_switch() -> dict:
    return dict(BASE, engine_env=serving_env(**dict([SWITCH])))


def node(name: str):
    return testinfra.get_host(f"ssh://{name}", ssh_config=str(state_dir() / "ssh" / "config"))


def inspect(name: str) -> dict | None:
    _, container, _ = HOSTS[name]
    out = node(name).run(f"docker container inspect {container}")
    return json.loads(out.stdout)[0] if out.rc == 0 else None


def env_of(container: dict) -> dict:
    return dict(item.split("=", 1) for item in container["Config"]["Env"])


def changed_hosts(run, task: str) -> set:
    """Hosts a task reported changed on, from the play's output: a no_log result reaches the events censored,
    without its changed flag."""
    sections = [part.split("\nTASK [", 1)[0] for part in run.stdout.split(f"TASK [engine : {task}]")[1:]]
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for section in sections for line in section.splitlines()]
    return {line.split("[", 1)[1].split("]", 1)[0] for line in lines if line.startswith("changed: [")}


def results(run, task: str) -> dict:
    return {r["_host"]: r for r in run.results(task=task) if r["_event"] != "runner_on_skipped"}


@pytest.fixture(scope="module")
def fleet_up(isolated_inventory):
    if os.geteuid() != 0:
        pytest.skip("the testbed needs root")
    if not os.access("/usr/sbin/dockerd", os.X_OK):
        pytest.skip("docker.io is not installed (make deps)")
    # roles/engine drives the containers through community.docker (docker's API socket): the real engine only.
    ensure_testbed(fresh=True, engine="docker")
    run = play("engine.yml", extravars=with_switch())
    assert run.rc == 0, run.stdout[-3000:]
    return run


def test_a_switch_in_engine_env_reaches_every_rank_through_one_shared_file(fleet_up):
    shared_digests = set()
    for name, (rank, container, recipe) in HOSTS.items():
        c = inspect(name)
        assert c and c["State"]["Running"], name
        env = env_of(c)
        assert env[SWITCH[0]] == SWITCH[1], name
        assert env["NODE_RANK"] == str(rank) and env["MEM_FRACTION_STATIC"] == "0.95"
        assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False" and "SIM_TIME_SCALE" in env
        host = node(name)
        shared = host.file(f"{recipe}/sparkfleet.env")
        from_file = dict(line.split("=", 1) for line in shared.content_string.splitlines()
                         if line and not line.startswith("#"))
        assert {k: env.get(k) for k in from_file} == from_file, f"{name}: the container env is not the file's"
        assert f"{SWITCH[0]}={SWITCH[1]}\n" in shared.content_string and "NODE_RANK" not in shared.content_string
        shared_digests.add(hashlib.sha256(shared.content).hexdigest())
        # The rank file: the declared per-rank keys and the RoCE v2 GID resolved on this node (the seed: index 3).
        assert host.file(f"{recipe}/sparkfleet-rank.env").content_string.endswith(
            f"MEM_FRACTION_STATIC=0.95\nNCCL_IB_GID_INDEX=3\nNCCL_IB_HCA=rocep1s0f0:1\nNODE_RANK={rank}\n")
        log = host.run(f"docker logs {container}").stdout
        assert "Engram prefetch ARMED" in log, f"{name}: the switch did not reach the engine"
    assert len(shared_digests) == 1, "the shared env file must be byte-identical on every node"


def test_a_second_converge_changes_nothing(fleet_up):
    before = {name: inspect(name)["Id"] for name in HOSTS}
    run = play("engine.yml", extravars=with_switch())
    assert run.rc == 0, run.stdout[-3000:]
    assert run.changed() == []
    assert {name: inspect(name)["Id"] for name in HOSTS} == before
    assert {r["_host"]: r["action"] for r in run.results(module="engine_container")} == dict.fromkeys(HOSTS, "none")
    checked = play("engine.yml", extravars=with_switch(), check=True, diff=True)
    assert checked.rc == 0 and checked.changed() == [], "a check run on a converged fleet must report no change"


def test_check_mode_shows_the_drift_and_changes_nothing(fleet_up):
    before = {name: (inspect(name)["Id"], node(name).file(f"{HOSTS[name][2]}/sparkfleet.env").content)
              for name in HOSTS}
    run = play("engine.yml", extravars=dict(BASE, engine_env=serving_env()), check=True, diff=True)
    assert run.rc == 0, run.stdout[-3000:]
    plans = results(run, "Compare this rank's engine container")
    for name in HOSTS:
        assert plans[name]["changed"] and plans[name]["action"] == "recreate"
        assert plans[name]["differences"] == [{"what": "env", "key": SWITCH[0], "desired": "0", "actual": SWITCH[1]}]
    assert {h for h, t in run.changed() if t.startswith("Render the env files")} == set(HOSTS)
    assert "Would boot every rank" in run.stdout
    assert {name: (inspect(name)["Id"], node(name).file(f"{HOSTS[name][2]}/sparkfleet.env").content)
            for name in HOSTS} == before


def test_a_hand_started_worker_shows_in_drift_and_is_recreated(fleet_up):
    # The recipe's launch line by hand, without the switch.
    hand = ("docker rm -f dsv41-worker && docker run -d --name dsv41-worker --network host --ipc host "
            "-e NODE_RANK=1 -e TP_SIZE=3 -e HEAD_IP=10.213.{id}.11 -e DIST_PORT=20000 -e SIM_TIME_SCALE=0.05 "
            "-v /home/zurih/dsv41-3x-spark/engram:/engram -v dsv41-weights:/models/DeepSeek-V4.1-Flash:ro "
            "-v /home/zurih/.cache:/root/.cache -v /home/zurih/dsv41-3x-spark/state:/state dsv41-3x-spark:local run")
    node("spark2").check_output(hand.format(id=os.environ.get("SPARKFLEET_TESTBED_ID", "0") or "0"))

    drift = play("drift.yml", extravars=dict(with_switch(), drift_roles=["engine_env", "engine"], drift_fail=True))
    assert drift.rc != 0, "drift_fail fails on the drifted rows"
    rows = {(host, row["item"]): row for host, items in
            json.loads(Path(drift.run_dir, "drift.json").read_text())["items"].items() for row in items}
    # The comparison between ranks (module_utils/drift_ranks.py): spark2 lacks a key rank 0 has.
    across = rows[("spark2", "engine env across ranks")]
    assert across["drifted"] and f"{SWITCH[0]}=(absent) (rank 0: {SWITCH[1]})" in across["actual"], across
    assert "playbooks/engine.yml -e engine_state=restarted" in across["fix"] and "engine_env_per_rank" in across["fix"]
    assert not rows[("spark3", "engine env across ranks")]["drifted"]
    # The hand-started worker has no NCCL GID keys while its peers have theirs: that comparison shows it too.
    gid = rows[("spark1", "engine_env NCCL GID keys across ranks")]
    assert gid["drifted"] and "spark2 NCCL_IB_GID_INDEX=(unset) NCCL_IB_HCA=(unset)" in gid["actual"], gid
    assert "engine_env_nccl_gid" in gid["fix"]
    failure = drift.results(task="Fail when anything drifted")[0]
    assert "spark2 engine env across ranks: differs:" in failure["msg"], failure["msg"]
    env_row = rows[("spark2", "engine dsv41-worker env (docker inspect)")]
    assert env_row["drifted"] and f"{SWITCH[0]}=(absent)" in env_row["actual"]
    assert rows[("spark2", "engine dsv41-worker env (docker inspect)")]["fix"] == "ansible-playbook playbooks/engine.yml"
    assert not rows[("spark3", "engine dsv41-worker env (docker inspect)")]["drifted"]
    env_files = [r for (h, item), r in rows.items() if h == "spark2" and item.startswith("engine_env Render the env files")]
    assert len(env_files) == 2 and not any(r["drifted"] for r in env_files), "the files are right; the container is not"

    run = play("engine.yml", extravars=with_switch())
    assert run.rc == 0, run.stdout[-3000:]
    plans = results(run, "Compare this rank's engine container with the desired one")
    assert plans["spark2"]["action"] == "recreate"
    assert {"what": "env", "key": SWITCH[0], "desired": SWITCH[1], "actual": None} in plans["spark2"]["differences"]
    # community.docker.docker_container recreates the hand-started worker only (its result is never shown: no_log).
    created = results(run, "Create or recreate this rank's engine container (community.docker)")
    assert set(created) == set(HOSTS) and all("censored" in r for r in created.values())
    assert changed_hosts(run, "Create or recreate this rank's engine container (community.docker)") == {"spark2"}
    started = results(run, "Start the workers' engines first")
    assert started["spark2"]["action"] == started["spark3"]["action"] == "start", "engine_container only starts"
    booted = {r["_host"]: r["msg"]["action"] for r in run.results(task="Record: engine boot")}
    assert booted == {"spark1": "start", "spark2": "recreate", "spark3": "start"}
    replaced = Path(run.run_dir, "boot-logs", "spark2-rank1-dsv41-worker.replaced.log").read_text()
    assert "'node_rank': 1, 'tp_size': 3" in replaced, "the hand-started container's log is kept before it is removed"
    assert env_of(inspect("spark2"))[SWITCH[0]] == SWITCH[1]
    clean = play("drift.yml", extravars=dict(with_switch(), drift_roles=["engine_env", "engine"]))
    items = json.loads(Path(clean.run_dir, "drift.json").read_text())["items"]
    assert [r for rows_ in items.values() for r in rows_ if r["drifted"]] == []


def _run_args(**change: str) -> list:
    flags = yaml.safe_load((ROOT / "roles/engine/defaults/main.yml").read_text())["engine_run_args"]
    return [f"{flag.split('=', 1)[0]}={change[flag]}" if flag in change else flag for flag in flags]


def test_an_option_only_community_docker_compares_recreates_every_rank_once(fleet_up):
    # The shm size is a run flag the project's own comparison never looked at; docker_container's does.
    smaller = dict(with_switch(), engine_run_args=_run_args(**{"--shm-size=32g": "16g"}))
    before = {name: inspect(name)["Id"] for name in HOSTS}
    checked = play("engine.yml", extravars=smaller, check=True, diff=True)
    assert checked.rc == 0, checked.stdout[-3000:]
    assert {name: inspect(name)["Id"] for name in HOSTS} == before, "check mode changes nothing"
    compared = results(checked, "Compare every option of this rank's engine container (community.docker)")
    assert set(compared) == set(HOSTS) and all("censored" in r for r in compared.values())
    assert changed_hosts(checked, "Compare every option of this rank's engine container (community.docker)") == set(HOSTS)
    shown = checked.results(task="Show the boot this run would do")[0]["msg"]
    assert shown.count("recreate (shm_size)") == 3, shown

    run = play("engine.yml", extravars=smaller)
    assert run.rc == 0, run.stdout[-3000:]
    after = {name: inspect(name) for name in HOSTS}
    assert all(c["HostConfig"]["ShmSize"] == 16 * 2**30 and c["State"]["Running"] for c in after.values())
    assert all(after[name]["Id"] != before[name] for name in HOSTS)
    for name, (rank, container, _) in HOSTS.items():
        assert Path(run.run_dir, "boot-logs", f"{name}-rank{rank}-{container}.replaced.log").stat().st_size > 0
    again = play("engine.yml", extravars=smaller)
    assert again.rc == 0 and again.changed() == [], "no change on a second run"
    assert {name: inspect(name)["Id"] for name in HOSTS} == {name: c["Id"] for name, c in after.items()}

    back = play("engine.yml", extravars=with_switch())
    assert back.rc == 0, back.stdout[-3000:]
    assert all(inspect(name)["HostConfig"]["ShmSize"] == 32 * 2**30 for name in HOSTS)


def test_a_run_flag_without_a_docker_container_option_is_refused_before_any_host_is_touched(fleet_up):
    run = play("engine.yml", extravars=dict(with_switch(), engine_run_args=_run_args() + ["--oom-kill-disable"]))
    assert run.rc != 0
    assert "engine_run_args: docker run flag '--oom-kill-disable' has no docker_container option here" in run.stdout


def test_a_restart_boots_the_workers_before_the_head_and_keeps_every_log(fleet_up):
    run = play("engine.yml", extravars=dict(with_switch(), engine_state="restarted"))
    assert run.rc == 0, run.stdout[-3000:]
    order = [(ev["event_data"]["task"], ev["event_data"]["host"]) for ev in run.events
             if ev.get("event") == "runner_on_ok" and ev["event_data"].get("task", "").startswith("Start the")]
    assert [h for _, h in order] in (["spark2", "spark3", "spark1"], ["spark3", "spark2", "spark1"])
    started = {name: inspect(name)["State"]["StartedAt"] for name in HOSTS}
    assert max(started["spark2"], started["spark3"]) < started["spark1"]
    head = results(run, "Start the head's engine")["spark1"]
    assert head["ready"] is True and "Ready: API on port 8888 (rank 0)" in head["ready_line"]
    for name, (rank, container, _) in HOSTS.items():
        log = Path(run.run_dir, "boot-logs", f"{name}-rank{rank}-{container}.log").read_text()
        assert f"'node_rank': {rank}, 'tp_size': 3" in log and "server_args={" in log
    record = run.record()
    assert record["outcome"] == "ok"
    assert {r["host"] for r in record["results"] if r["module"] == "engine_container"} == set(HOSTS)


def test_a_failed_boot_keeps_every_log_and_names_the_rank(fleet_up):
    failing = dict(with_switch(), engine_env_per_rank={"NODE_RANK": "{{ fleet_rank }}",
                                                       "MEM_FRACTION_STATIC": {"0": "0.99"}})
    run = play("engine.yml", extravars=failing)
    assert run.rc != 0
    failures = {f["host"]: f["msg"] for f in run.record()["failures"]
                if f["task"].endswith("Name the rank that failed to boot")}
    assert list(failures) == ["spark1"]
    assert failures["spark1"].startswith("rank 0 (spark1, dsv41-head) failed to boot: ")
    assert "NV_ERR_NO_MEMORY" in failures["spark1"]
    lines = results(run, "Show the last log lines of a rank that failed")["spark1"]["msg"]
    assert any("mem_fraction_static=0.99" in line for line in lines)
    logs = {p.name for p in Path(run.run_dir, "boot-logs").iterdir()}
    assert {"spark1-rank0-dsv41-head.log", "spark2-rank1-dsv41-worker.log", "spark3-rank2-dsv41-worker.log"} <= logs
    assert "NV_ERR_NO_MEMORY" in Path(run.run_dir, "boot-logs", "spark1-rank0-dsv41-head.log").read_text()
    assert not any(inspect(name)["State"]["Running"] for name in HOSTS), "the waiting workers are stopped"
    recovered = play("engine.yml", extravars=with_switch())
    assert recovered.rc == 0, recovered.stdout[-3000:]
    assert all(inspect(name)["State"]["Running"] for name in HOSTS)


@pytest.mark.parametrize("extravars, text", [
    ({"engine_env_per_rank": {"NODE_RANK": "{{ fleet_rank }}", "MEM_FRACTON_STATIC": {"0": "0.9"}}},
     "engine_env_per_rank has an unknown key MEM_FRACTON_STATIC"),
    ({"engine_env": serving_env(EXTRA_SGLANG_ARGS="--enable-metrics\n--x")},
     "engine_env.EXTRA_SGLANG_ARGS contains a newline"),
    ({"engine_env": serving_env(**{"DSV41_X=1": "1"})}, "engine_env key 'DSV41_X=1' is not a variable name"),
    ({"engine_image": "dsv41-3x-spark :local"}, "is not a docker image reference"),
    ({"engine_ready_timeout_s": 0}, "engine_ready_timeout_s must be more than 0 seconds, got 0"),
], ids=["unknown-per-rank-key", "newline-in-value", "equals-in-key", "image-with-space", "ready-timeout-0"])
def test_bad_input_is_refused_before_any_host_is_touched(fleet_up, extravars, text):
    before = {name: (inspect(name)["Id"], node(name).file(f"{HOSTS[name][2]}/sparkfleet.env").content)
              for name in HOSTS}
    run = play("engine.yml", extravars=dict(BASE, **extravars))
    assert run.rc != 0
    assert text in run.stdout
    touched = [(ev["event_data"]["host"], ev["event_data"]["task"]) for ev in run.events
               if ev.get("event") in ("runner_on_ok", "runner_on_failed")
               and ev["event_data"].get("host") in HOSTS
               and ev["event_data"].get("task_action", "").rsplit(".", 1)[-1] not in CONTROLLER_ONLY]
    assert touched == []
    assert {name: (inspect(name)["Id"], node(name).file(f"{HOSTS[name][2]}/sparkfleet.env").content)
            for name in HOSTS} == before


def test_a_secret_in_the_env_never_shows_in_results_diff_or_record(fleet_up):
    # issue 19 item 13: a real check run with --diff; the secret and the URL password appear nowhere.
    token, password = "hf_sparkfleet_secret_4711", "pw_sparkfleet_0815"
    env = serving_env(HF_TOKEN=token, HF_ENDPOINT=f"https://mia:{password}@hub.example/api")
    run = play("engine.yml", extravars=dict(BASE, engine_env=env), check=True, diff=True)
    assert run.rc == 0, run.stdout[-3000:]
    plans = results(run, "Compare this rank's engine container")
    assert {"what": "env", "key": "HF_TOKEN", "desired": "********", "actual": None} in plans["spark1"]["differences"]
    assert "HF_TOKEN=********" in run.stdout and "HF_ENDPOINT=https://hub.example/api" in run.stdout
    record = Path(run.run_dir, "record.json")
    shown = {"stdout": run.stdout, "record": record.read_text(),
             "engine_container results": json.dumps(run.results(module="engine_container"))}
    for where, text in shown.items():
        assert token not in text and password not in text, where
    assert record.stat().st_mode & 0o777 == 0o600 and Path(run.run_dir).stat().st_mode & 0o777 == 0o700
