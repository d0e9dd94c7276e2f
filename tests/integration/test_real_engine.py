"""The testbed on a real Docker engine (issue 22, stage 1): `testbed/fleet up --engine docker` gives every host its
own dockerd inside its namespaces; the roles drive it through the docker CLI as on the fleet. Checked here:
up/down (daemons in the hosts' namespaces, no bridge, nothing listening, stopped by pid, state removed), engine
start/restart/stop in order, a failed boot naming its rank with every log kept, quiesce pausing and restoring
exactly its containers (real freezer-cgroup pauses), each rank's simulated GPU feeling its host's running
containers through the engine's API (and quiesce removing spark3's share at the next boot), and the checkpoint
verified through a worker's volume.

The real engine is the testbed's only engine since stage 2: the other modules run on it too; this one checks the
daemons themselves and takes its testbed down at the end (the next module's `ensure_testbed` brings one up)."""
from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
import testinfra

from tests.integration.conftest import ensure_testbed, fleet, play, state_dir

# Slow (5-21 min on a loaded 2-core machine; `make integration-slow` runs it): what it shares with test_engine.py,
# test_host_tuning.py and test_checkpoint_manifest.py runs in `make integration` on the same engine.
pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.usefixtures("isolated_inventory")]

HOSTS = {"spark1": (0, "dsv41-head"), "spark2": (1, "dsv41-worker"), "spark3": (2, "dsv41-worker")}
HOMELAB = ["code-server", "comfyui", "filebrowser", "grafana", "jupyter-lab", "minio", "netdata", "nginx-proxy",
           "node-exporter", "ollama", "open-webui", "portainer", "postgres", "prometheus", "redis", "syncthing",
           "tensorboard", "uptime-kuma", "watchtower"]
BASE = {"preflight_skip": True}


def node(name: str):
    return testinfra.get_host(f"ssh://{name}", ssh_config=str(state_dir() / "ssh" / "config"))


def inspect(name: str) -> dict | None:
    out = node(name).run(f"docker container inspect {HOSTS[name][1]}")
    return json.loads(out.stdout)[0] if out.rc == 0 else None


def states(name: str) -> dict:
    out = node(name).check_output("docker ps -a --format '{{.Names}} {{.State}}'")
    return dict(line.split() for line in out.splitlines())


def state() -> dict:
    return json.loads((state_dir() / "state.json").read_text())


@pytest.fixture(scope="module")
def real_fleet(isolated_inventory):
    if os.geteuid() != 0:
        pytest.skip("the testbed needs root")
    if not os.access("/usr/sbin/dockerd", os.X_OK):
        pytest.skip("docker.io is not installed (make deps)")
    # Fresh: a module before this one may leave spark3's containers as it set them (test_host_tuning.py leaves
    # redis paused), and the quiesce tests here start from the seed's 19 running ones.
    ensure_testbed(engine="docker", fresh=True)
    run = play("engine.yml", extravars=BASE)
    assert run.rc == 0, run.stdout[-3000:]
    yield run


def _ns(pid: int, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def test_every_host_runs_its_own_dockerd_inside_its_namespaces(real_fleet):
    current = state()
    assert current["engine"] == "docker" and set(current["dockerd"]) == set(HOSTS)
    daemons = set()
    for name, pid in current["dockerd"].items():
        anchor = current["pids"][name]          # the host's sshd
        assert all(_ns(pid, kind) == _ns(anchor, kind) for kind in ("net", "mnt", "uts")), name
        assert _ns(pid, "mnt") != _ns(os.getpid(), "mnt")
        argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        assert {"--bridge=none", "--iptables=false", "--ip6tables=false", "--storage-driver=overlay2"} <= set(argv)
        assert argv[argv.index("--cgroup-parent") + 1] == f"sparkfleet-tb{os.environ.get('SPARKFLEET_TESTBED_ID') or 0}-{name}"
        daemons.add(_ns(pid, "mnt"))
        h = node(name)
        assert h.check_output("docker info --format '{{.ServerVersion}} {{.Driver}}'").split()[1] == "overlay2"
        # The data-root is the host's own tmpfs (overlay2 cannot sit on the host's /var overlay); dockerd's
        # overlay mounts live in the host's mount namespace only.
        assert h.check_output("findmnt -n -o FSTYPE /var/lib/docker") == "tmpfs"
        assert "/var/lib/docker/overlay2/" in h.check_output("findmnt -n -t overlay -o TARGET")
        assert "/var/lib/docker" not in Path("/proc/self/mountinfo").read_text()
        assert h.socket("unix:///var/run/docker.sock").is_listening
        assert h.run("ip link show docker0").rc != 0, "no bridge"
        # Nothing of dockerd's listens on TCP; every TCP listener is on the testbed's address or loopback.
        listeners = h.check_output("ss -Hltnp")
        assert "dockerd" not in listeners and "containerd" not in listeners
    assert len(daemons) == 3, "one daemon per host"


def test_the_recipe_flags_reach_the_real_engine(real_fleet):
    for name, (rank, _) in HOSTS.items():
        c = inspect(name)
        hc = c["HostConfig"]
        assert c["State"]["Running"] and hc["NetworkMode"] == "host" and hc["IpcMode"] == "host"
        assert hc["ShmSize"] == 32 * 2**30 and hc["Privileged"] is True
        assert {u["Name"]: (u["Soft"], u["Hard"]) for u in hc["Ulimits"]} == {
            "memlock": (-1, -1), "stack": (67108864, 67108864)}
        assert [(r["Driver"], r["Count"], r["Capabilities"]) for r in hc["DeviceRequests"]] == [("", -1, [["gpu"]])]
        assert [d["PathOnHost"] for d in hc["Devices"]] == ["/dev/infiniband"]
        # The host's stand-in RDMA nodes are character devices inside the container.
        assert node(name).check_output(f"docker exec {HOSTS[name][1]} ls /dev/infiniband").split() == [
            "rdma_cm", "uverbs0", "uverbs1"]
        model = [m for m in c["Mounts"] if m["Destination"] == "/models/DeepSeek-V4.1-Flash"][0]
        if rank == 0:
            assert model["Type"] == "bind" and model["RW"] is False
        else:
            assert (model["Type"], model["Name"], model["RW"]) == ("volume", "dsv41-weights", False)
        # The GPU hook stand-in ran for this container (dockerd found it on its PATH: --gpus all).
        hooks = [json.loads(line) for line in node(name).file("/run/testbed/nvidia-hook.log").content_string.splitlines()]
        assert any(h["id"] == c["Id"] and h["visible_devices"] == "all" for h in hooks)
        # The container saw the host's RoCE GID table through the hook (the simulator read it to boot).
        assert node(name).run(f"docker exec {HOSTS[name][1]} cat /sys/class/infiniband/rocep1s0f0/ports/1/gids/0").rc == 0


def test_a_restart_boots_the_workers_before_the_head_and_keeps_every_log(real_fleet):
    before = {name: inspect(name)["State"]["StartedAt"] for name in HOSTS}
    run = play("engine.yml", extravars=dict(BASE, engine_state="restarted"))
    assert run.rc == 0, run.stdout[-3000:]
    started = {name: inspect(name)["State"]["StartedAt"] for name in HOSTS}
    assert all(started[name] > before[name] for name in HOSTS)
    assert max(started["spark2"], started["spark3"]) < started["spark1"]
    for name, (rank, container) in HOSTS.items():
        log = Path(run.run_dir, "boot-logs", f"{name}-rank{rank}-{container}.log").read_text()
        assert f"'node_rank': {rank}, 'tp_size': 3" in log


def test_a_failed_boot_keeps_every_log_and_names_the_rank(real_fleet):
    failing = dict(BASE, engine_env_per_rank={"NODE_RANK": "{{ fleet_rank }}", "MEM_FRACTION_STATIC": {"0": "0.99"}})
    run = play("engine.yml", extravars=failing)
    assert run.rc != 0
    failures = {f["host"]: f["msg"] for f in run.record()["failures"]
                if f["task"].endswith("Name the rank that failed to boot")}
    assert list(failures) == ["spark1"]
    assert failures["spark1"].startswith("rank 0 (spark1, dsv41-head) failed to boot: ")
    assert "NV_ERR_NO_MEMORY" in Path(run.run_dir, "boot-logs", "spark1-rank0-dsv41-head.log").read_text()
    assert {p.name for p in Path(run.run_dir, "boot-logs").iterdir()} >= {
        "spark1-rank0-dsv41-head.log", "spark2-rank1-dsv41-worker.log", "spark3-rank2-dsv41-worker.log"}
    # The failed head's container is kept (its log is evidence) and the waiting workers are stopped.
    assert inspect("spark1") is not None
    assert not any(inspect(name)["State"]["Running"] for name in HOSTS)
    recovered = play("engine.yml", extravars=BASE)
    assert recovered.rc == 0, recovered.stdout[-3000:]
    assert all(inspect(name)["State"]["Running"] for name in HOSTS)


def test_quiesce_pauses_and_restores_exactly_its_containers(real_fleet):
    spark3 = node("spark3")
    spark3.check_output("docker pause redis")        # paused by hand: not quiesce's to restore
    quiet = play("site.yml", extravars=BASE, limit="spark3", tags="quiesce")
    assert quiet.rc == 0, quiet.stdout[-3000:]
    now = states("spark3")
    assert {n: now[n] for n in HOMELAB} == dict.fromkeys(HOMELAB, "paused")
    assert now["dsv41-worker"] == "running"
    # A real pause: the container's processes are frozen in its cgroup.
    cid = spark3.check_output("docker inspect --format '{{.Id}}' grafana")
    pid = spark3.check_output("docker inspect --format '{{.State.Pid}}' grafana")
    assert "T" in spark3.check_output(f"ps -o stat= -p {pid}") or \
        spark3.run(f"grep -q FROZEN /sys/fs/cgroup/freezer/*/{cid}/freezer.state").rc == 0
    record = json.loads(spark3.file("/var/lib/sparkfleet/quiesce.json").content_string)
    assert sorted(a["name"] for a in record["actions"]) == sorted(set(HOMELAB) - {"redis"})
    restored = play("site.yml", extravars=dict(BASE, quiesce_state="restored"), limit="spark3", tags="quiesce")
    assert restored.rc == 0, restored.stdout[-3000:]
    now = states("spark3")
    assert {n: now[n] for n in HOMELAB} == {**dict.fromkeys(HOMELAB, "running"), "redis": "paused"}
    spark3.check_output("docker unpause redis")


# The head's step model (its /server_info, read inside its container: port 8888 on the host network, the API key
# if one is set): each rank's contention as that rank measured it at its boot.
SERVER_INFO = ("import json, urllib.request\n"
               "try:\n    key = open('/state/api-key').read().strip()\nexcept OSError:\n    key = ''\n"
               "headers = {'Authorization': 'Bearer ' + key} if key else {}\n"
               "req = urllib.request.Request('http://127.0.0.1:8888/server_info', headers=headers)\n"
               "print(json.dumps(json.load(urllib.request.urlopen(req, timeout=30))['step_model']['terms']))\n")


def step_terms() -> dict:
    return json.loads(node("spark1").check_output(f"docker exec dsv41-head python3 -c {shlex.quote(SERVER_INFO)}"))


def expected_contention_ms(name: str) -> float:
    """What sim.py's model charges a rank for its host, from the host's real state: 0.15 ms for each running
    (not paused) container that is not the fleet's, 1.5 ms for a running desktop (fake_gdm.py holds a lock on
    its pid file), 1.0 ms for an SM clock capped under 2600 MHz."""
    h = node(name)
    busy = [n for n, st in states(name).items() if st == "running" and not n.startswith("dsv41-")]
    desktop = h.run("flock -n -s /run/testbed/desktop.pid true").rc != 0 if h.file("/run/testbed/desktop.pid").exists else False
    gpu = json.loads(h.file("/run/testbed/gpu.json").content_string) if h.file("/run/testbed/gpu.json").exists else {}
    capped = bool(gpu.get("locked")) and gpu["locked"][1] < 2600
    return 0.15 * len(busy) + (1.5 if desktop else 0.0) + (1.0 if capped else 0.0)


def test_each_rank_feels_its_hosts_running_containers_and_quiesce_removes_them(real_fleet):
    """Issue 22: the rank simulator counted spark3's background containers in a folder of the removed docker CLI
    stand-in, so on the real engine its 19 running containers cost nothing and quiesce had no modelled gain.
    The GPU hook stand-in binds the host's Docker API socket into the container; the rank asks it at boot."""
    running = [n for n in HOMELAB if states("spark3")[n] == "running"]
    assert running == HOMELAB, "the seed's 19 background containers run on spark3"
    before = {r["rank"]: r["contention_ms"] for r in step_terms()["per_rank"]}
    for name, (rank, _) in HOSTS.items():
        assert before[rank] == pytest.approx(expected_contention_ms(name)), name
    assert before[2] >= 19 * 0.15
    quiet = play("site.yml", extravars=BASE, limit="spark3", tags="quiesce")
    assert quiet.rc == 0, quiet.stdout[-3000:]
    try:
        # Read once per boot: the pause does not reach a running rank; the next boot sees it.
        assert {r["rank"]: r["contention_ms"] for r in step_terms()["per_rank"]} == before
        restart = play("engine.yml", extravars=dict(BASE, engine_state="restarted"))
        assert restart.rc == 0, restart.stdout[-3000:]
        after = {r["rank"]: r["contention_ms"] for r in step_terms()["per_rank"]}
        assert after[2] == pytest.approx(expected_contention_ms("spark3"))
        assert before[2] - after[2] == pytest.approx(0.15 * len(running))
        assert after[0] == before[0] and after[1] == before[1]
    finally:
        restored = play("site.yml", extravars=dict(BASE, quiesce_state="restored"), limit="spark3", tags="quiesce")
        assert restored.rc == 0, restored.stdout[-3000:]


def test_the_checkpoint_is_verified_through_each_workers_volume(real_fleet, tmp_path):
    manifest = tmp_path / "DeepSeek-V4.1-Flash.json"
    run = play("checkpoint_manifest.yml", extravars={"checkpoint_manifest_file": str(manifest)})
    assert run.rc == 0, run.stdout[-3000:]
    rec = [r for r in run.record()["results"] if r["task"] == "Record: checkpoint verification"]
    nodes = rec[0]["result"]["ansible_facts"]["checkpoint_verification"]["nodes"]
    assert {h: (n["ok"], n["through"], n["hashed_files"]) for h, n in nodes.items()} == {
        "spark1": (True, "path", 49), "spark2": (True, "volume:dsv41-weights", 49),
        "spark3": (True, "volume:dsv41-weights", 49)}


def test_stop_then_down_stops_every_daemon_by_pid_and_removes_its_state(real_fleet):
    run = play("engine.yml", extravars=dict(BASE, engine_state="stopped"))
    assert run.rc == 0, run.stdout[-3000:]
    assert not any(inspect(name)["State"]["Running"] for name in HOSTS)
    current = state()
    daemons = current["dockerd"]
    containers = [int(p) for p in node("spark3").check_output(
        "docker inspect --format '{{.State.Pid}}' $(docker ps -q)").split()]
    assert len(containers) == len(HOMELAB)
    fleet("down")
    for name, pid in daemons.items():
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", name
    assert not state_dir().exists()
    testbed_id = os.environ.get("SPARKFLEET_TESTBED_ID") or "0"
    for name in HOSTS:
        assert not list(Path("/sys/fs/cgroup").glob(f"*/sparkfleet-tb{testbed_id}-{name}")), name
    # No container process is left anywhere (spark3's 19 --network none containers share no host namespace).
    for pid in containers:
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", pid
