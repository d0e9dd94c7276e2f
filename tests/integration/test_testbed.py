"""The testbed itself (issue: foundation): hosts, isolation, stand-ins, seed scenario, up/down hygiene."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.integration.conftest import ROOT, ensure_testbed, fleet, run_playbook, state_dir

pytestmark = pytest.mark.testbed
ROWS = {1: 120_003, 14: 96_001}
TESTBED_ID = os.environ.get("SPARKFLEET_TESTBED_ID") or "0"
SUBNET = f"10.213.{TESTBED_ID}"
NS = "" if TESTBED_ID == "0" else f"tb{TESTBED_ID}-"


def shard_bytes(n: int, rank: int, tp: int) -> int:
    lo, hi = n * rank // tp, n * (rank + 1) // tp
    return 4096 + (hi - lo) * 264


@pytest.fixture(scope="module", autouse=True)
def _fresh_seed():
    """These tests describe the seed scenario as `fleet up` makes it: start from a fresh one, whatever the
    modules before left running (a rollout test leaves the engine serving on spark3, a 20th container)."""
    if os.geteuid() == 0:
        ensure_testbed(fresh=True)


def test_every_host_answers_over_ssh_with_its_own_name(testbed, host):
    for index, name in enumerate(("spark1", "spark2", "spark3"), start=1):
        h = host(name)
        assert h.check_output("hostname") == name
        assert f"{SUBNET}.{10 + index}" in h.check_output("hostname -I")


def test_hosts_are_isolated(testbed, host):
    marker = "/root/isolation-probe"
    host("spark1").run(f"echo spark1 > {marker}")
    try:
        assert host("spark1").file(marker).content_string.strip() == "spark1"
        assert not host("spark2").file(marker).exists
        assert not host("spark3").file(marker).exists
        assert not os.path.exists(marker)
    finally:
        host("spark1").run(f"rm -f {marker}")


def test_hosts_cannot_reach_anything_but_the_testbed(testbed, host):
    routes = host("spark1").check_output("ip route")
    assert "default" not in routes
    assert f"{SUBNET}.0/24" in routes


def _ns(pid: int, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def test_every_host_runs_its_own_dockerd_and_nothing_listens_outside_the_testbed(testbed, host):
    state = json.loads((state_dir() / "state.json").read_text())
    assert state["engine"] == "docker" and set(state["dockerd"]) == {"spark1", "spark2", "spark3"}
    for name, pid in state["dockerd"].items():
        anchor = state["pids"][name]          # the host's sshd
        assert all(_ns(pid, kind) == _ns(anchor, kind) for kind in ("net", "mnt", "uts")), name
        h = host(name)
        assert h.check_output("docker info --format '{{.Driver}}'") == "overlay2"
        assert h.run("ip link show docker0").rc != 0, "no bridge"
        # Every TCP listener (sshd, an engine's API) is on the testbed's subnet or loopback; dockerd has none.
        for line in h.check_output("ss -Hltn").splitlines():
            address = line.split()[3].rsplit(":", 1)[0].strip("[]")
            assert address.startswith(f"{SUBNET}.") or address in ("127.0.0.1", "::1"), (name, line)


def test_background_containers_stop_on_sigterm(testbed, host):
    """PID 1 of a container gets no SIGTERM it has no handler for: the testbed's sleepers trap it, so `docker stop`
    (quiesce's stop action) and each daemon's shutdown at `down` do not wait out a timeout and SIGKILL."""
    h = host("spark3")
    h.check_output("docker stop -t 30 grafana")
    try:
        assert h.check_output("docker inspect --format '{{.State.ExitCode}}' grafana") == "0"
    finally:
        h.check_output("docker start grafana")


def test_seed_spark2_lacks_space_for_its_tp3_shards(testbed, host):
    need = sum(shard_bytes(n, 1, 3) for n in ROWS.values())
    free = int(host("spark2").check_output("df -B1 --output=avail /home/zurih/dsv41-3x-spark/engram | tail -1"))
    stale = host("spark2").check_output("ls /home/zurih/dsv41-engram")
    assert free < need, f"spark2 should not fit {need} bytes, has {free}"
    assert "engram-l1-r1of2.bin" in stale and "engram-l14-r1of2.bin" in stale


def test_seed_spark3_is_crowded(testbed, host):
    h = host("spark3")
    names = h.check_output("docker ps --format '{{.Names}}'").split()
    assert len(names) == 19 and "grafana" in names
    assert h.service("gdm").is_running
    assert h.check_output("systemctl get-default") == "graphical.target"
    assert "19" == h.check_output("docker ps -q | wc -l")


def test_stand_ins_answer_like_the_real_tools(testbed, host):
    h = host("spark1")
    csv = h.check_output("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader")
    assert csv == "NVIDIA GB10, 580.159.03"
    assert "Max                               : 2200 MHz" in h.check_output("nvidia-smi -q -d CLOCK")
    assert h.service("nvidia-clock-lock").is_enabled
    inspect = json.loads(h.check_output("docker image inspect dsv41-3x-spark:local"))
    assert inspect[0]["Config"]["Entrypoint"] == ["python3", "-u", "/opt/dsv41/boot.py"]
    assert "MemAvailable:" in h.file("/proc/meminfo").content_string
    worker = json.loads(host("spark2").check_output("docker volume inspect dsv41-weights"))
    # The fleet's NFS volume is the testbed's bind-backed local volume of the same name and mount point
    # (docs/testbed.md "Real engine": the options come from the host spec).
    assert (worker[0]["Options"]["type"], worker[0]["Options"]["o"]) == ("none", "bind")


def test_worker_sees_the_checkpoint_only_through_the_volume(testbed, host):
    h = host("spark2")
    assert not h.file("/srv/models/DeepSeek-V4.1-Flash").exists
    out = h.check_output("docker run --rm -v dsv41-weights:/models/DeepSeek-V4.1-Flash:ro --entrypoint ls "
                         "sparkfleet/sleeper /models/DeepSeek-V4.1-Flash")
    assert "model.safetensors.index.json" in out
    denied = h.run("docker run --rm -v dsv41-weights:/m:ro --entrypoint sh sparkfleet/sleeper -c 'touch /m/x'")
    assert denied.rc != 0


def test_validation_play_names_the_problem(testbed, tmp_path):
    bad = tmp_path / "inventory"
    bad.mkdir()
    (bad / "hosts.yml").write_text(
        (ROOT / "inventory/testbed/hosts.yml").read_text().replace("fleet_rank: 2", "fleet_rank: 1"))
    (bad / "group_vars").symlink_to(ROOT / "inventory/testbed/group_vars")
    run = run_playbook("site.yml", inventory=bad)
    assert run.rc != 0
    assert "rank 1 is given to several hosts: spark2, spark3" in run.stdout
    assert run.record()["outcome"] == "failed"
    assert not [e for e in run.events if e.get("event_data", {}).get("host") in ("spark1", "spark2", "spark3")
                and e["event"] == "runner_on_ok"], "no host may be touched"


def test_bad_arguments_give_one_clear_line():
    for args, text in ((["up", "--hosts", "1"], "between 2 and 8"), (["up", "--hosts", "9"], "between 2 and 8"),
                       (["up", "--scenario", "nope"], "unknown scenario")):
        proc = fleet(*args, check=False)
        assert proc.returncode == 2
        assert text in proc.stderr and "Traceback" not in proc.stderr


def test_up_is_idempotent(testbed):
    proc = fleet("up")
    assert "nothing changed" in proc.stderr


def test_four_hosts_then_down_leaves_nothing(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the testbed needs root")
    fleet("down")
    try:
        fleet("up", "--hosts", "4", "--scenario", "clean")
        proc = subprocess.run(["ip", "netns", "exec", f"{NS}spark4", "true"], capture_output=True)
        assert proc.returncode == 0
        inventory = tmp_path / "inventory"
        inventory.mkdir()
        hosts = (ROOT / "inventory/testbed/hosts.yml").read_text() + (
            "    spark4:\n      ansible_host: \"{{ _testbed_subnet }}.14\"\n      fleet_rank: 3\n"
            "      fleet_role: worker\n      fleet_user: zurih\n"
            "      fleet_engram_dir: /home/zurih/dsv41-3x-spark/engram\n"
            "      fleet_recipe_dir: /home/zurih/dsv41-3x-spark\n")
        (inventory / "hosts.yml").write_text(hosts)
        (inventory / "group_vars").symlink_to(ROOT / "inventory/testbed/group_vars")
        run = run_playbook("site.yml", extravars={"fleet_tp_size": 4}, inventory=inventory)
        assert run.rc == 0, run.stdout[-2000:]
        assert {r["_host"] for r in run.results(module="ping")} == {"spark1", "spark2", "spark3", "spark4"}
        daemons = json.loads((state_dir() / "state.json").read_text())["dockerd"]
        assert set(daemons) == {"spark1", "spark2", "spark3", "spark4"}
    finally:
        fleet("down")
    for name, pid in daemons.items():   # stopped by pid (a zombie of an exited daemon is gone)
        assert not os.path.exists(f"/proc/{pid}") or \
            open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", name
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n.split()[0] in (f"{NS}fleetctl", f"{NS}spark1", f"{NS}spark4") for n in names.splitlines() if n)
    mounts = open("/proc/self/mountinfo").read()
    assert ".testbed" not in mounts
    assert not state_dir().exists()
    ensure_testbed()
