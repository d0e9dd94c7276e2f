"""library/engine_container (with module_utils/engine_container), the engine_env role's filters and the two
inventories' serving env, run in-process against an in-memory docker CLI. The module compares, starts, restarts,
stops and waits; it never creates, recreates or removes a container (community.docker.docker_container does)."""
from __future__ import annotations

import importlib.util
import json

import pytest
import yaml

from tests.conftest import ROOT, load_module
from tests.unit.module_harness import run_module

from ansible.module_utils import engine_container as ec

MODULE = load_module("engine_container")

_spec = importlib.util.spec_from_file_location(
    "sparkfleet_filter_engine_env", ROOT / "plugins" / "filter" / "engine_env.py")
envf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(envf)

IMAGE_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "PYTHONPATH=/opt/dsv41/adapter:/opt/sglang-sim", "SGLANG_VERSION=0.5.4.post2+dsv41"]
IMAGE_ID = "sha256:" + "a" * 64
NEW_IMAGE_ID = "sha256:" + "b" * 64
READY = "[2026-11-29 20:04:02 TP0] Ready: API on port 8888 (rank 0), no API key."


class FakeDocker:
    """The docker CLI subset engine_container calls, in memory (docker's --env-file and -e semantics)."""

    def __init__(self):
        self.images = {"dsv41-3x-spark:local": {"Id": IMAGE_ID, "Config": {
            "Env": list(IMAGE_ENV), "Labels": {"engine.version": "0.5.4.post2+dsv41", "flashinfer.version": "0.5.2"}}}}
        self.containers: dict = {}
        self.calls: list = []
        self.on_start = lambda name: ["booting"]   # lines a start appends to the log
        self.log_script: list = []                 # per `docker logs` call: lines appended first

    def image_by(self, ref):
        if ref in self.images:
            return self.images[ref]
        return next((i for i in self.images.values() if i["Id"] == ref), None)

    def add_container(self, name, env, mounts, image=IMAGE_ID, running=True, log=()):
        self.containers[name] = {
            "Id": "c" * 64, "Name": "/" + name, "Image": image,
            "Config": {"Image": "dsv41-3x-spark:local", "Env": list(IMAGE_ENV) + [f"{k}={v}" for k, v in env.items()]},
            "State": {"Status": "running" if running else "exited", "Running": running, "ExitCode": 0 if running else 1,
                      "StartedAt": "2026-11-29T20:00:00Z", "FinishedAt": "0001-01-01T00:00:00Z"},
            "Mounts": [ec_mount(m) for m in mounts], "log": list(log)}

    def __call__(self, argv):
        assert argv[0] == "docker"
        args = argv[1:]
        self.calls.append(args)
        verb = args[0]
        if args[:2] == ["container", "inspect"]:
            c = self.containers.get(args[2])
            if c is None:
                return 1, "[]\n", f"Error: No such container: {args[2]}\n"
            return 0, json.dumps([{k: v for k, v in c.items() if k != "log"}]), ""
        if args[:2] == ["image", "inspect"]:
            image = self.image_by(args[2])
            if image is None:
                return 1, "[]\n", f"Error response from daemon: No such image: {args[2]}\n"
            return 0, json.dumps([image]), ""
        if verb == "logs":
            c = self.containers[args[1]]
            if self.log_script:
                step = self.log_script.pop(0)
                if step == "exit":
                    c["State"].update(Status="exited", Running=False, ExitCode=1)
                else:
                    c["log"].extend(step)
            return 0, "".join(line + "\n" for line in c["log"]), ""
        if verb == "start":
            c = self.containers[args[1]]
            c["State"].update(Status="running", Running=True)
            c["log"].extend(self.on_start(args[1]))
            return 0, args[1] + "\n", ""
        if verb == "stop":
            c = self.containers[args[-1]]
            c["State"].update(Status="exited", Running=False, ExitCode=143)
            return 0, args[-1] + "\n", ""
        raise AssertionError(f"unexpected docker call {args}")

    def mutating(self):
        return [c for c in self.calls if c[0] in ("run", "start", "stop", "rm")]


def ec_mount(spec):
    m = ec.parse_mount(spec)
    if m.source.startswith("/"):
        return {"Type": "bind", "Source": m.source, "Destination": m.destination, "RW": not m.read_only}
    return {"Type": "volume", "Name": m.source, "Source": f"/var/lib/docker/volumes/{m.source}/_data",
            "Destination": m.destination, "RW": not m.read_only}


ENV = {"NODE_RANK": "1", "TP_SIZE": "3", "HEAD_IP": "10.213.3.11", "DSV41_AUTOTUNE_KEEP": "1",
       "EXTRA_SGLANG_ARGS": "", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}
MOUNTS = ["dsv41-weights:/models/DeepSeek-V4.1-Flash:ro", "/home/zurih/dsv41-3x-spark/state:/state",
          "/home/zurih/.cache:/root/.cache", "/home/zurih/dsv41-3x-spark/engram:/engram"]


@pytest.fixture
def docker(monkeypatch):
    fake = FakeDocker()
    from ansible.module_utils.basic import AnsibleModule

    def run_command(self, args, **kwargs):
        return fake(list(args))
    monkeypatch.setattr(AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(ec.time, "sleep", lambda s: None)
    return fake


def args(**over):
    base = {"name": "dsv41-worker", "image": "dsv41-3x-spark:local", "env": dict(ENV), "mounts": list(MOUNTS)}
    base.update(over)
    return base


# ---------------------------------------------------------------- compare (the rank's plan)

def test_check_mode_reports_a_missing_container_as_create_and_changes_nothing(docker):
    out = run_module(MODULE, args(), check_mode=True, diff=True)
    r = out.result
    assert (r["action"], r["changed"], r["container"], r["image_id"]) == ("create", True, None, IMAGE_ID)
    assert r["msg"] == "dsv41-worker: would create"
    assert r["diff"]["before"] == "absent\n" and "  DSV41_AUTOTUNE_KEEP=1\n" in r["diff"]["after"]
    assert docker.mutating() == [] and docker.containers == {}


def test_a_matching_container_is_left_alone_and_the_images_own_env_is_ignored(docker):
    docker.add_container("dsv41-worker", ENV, MOUNTS)
    out = run_module(MODULE, args(), diff=True)
    assert (out.result["action"], out.result["changed"], out.result["differences"]) == ("none", False, [])
    assert "diff" not in out.result and docker.mutating() == []
    assert "PATH" not in out.result["container"]["env"] and out.result["container"]["env"]["NODE_RANK"] == "1"


@pytest.mark.parametrize("change, difference", [
    ({"env_drop": "DSV41_AUTOTUNE_KEEP"}, {"what": "env", "key": "DSV41_AUTOTUNE_KEEP", "desired": "1", "actual": None}),
    ({"env_add": ("SGLANG_LOG_LEVEL", "debug")},
     {"what": "env", "key": "SGLANG_LOG_LEVEL", "desired": None, "actual": "debug"}),
    ({"env_add": ("PYTHONPATH", "/elsewhere")},
     {"what": "env", "key": "PYTHONPATH", "desired": None, "actual": "/elsewhere"}),
    ({"env_add": ("NODE_RANK", "2")}, {"what": "env", "key": "NODE_RANK", "desired": "1", "actual": "2"}),
    ({"image": NEW_IMAGE_ID}, {"what": "image", "key": "id", "desired": IMAGE_ID, "actual": NEW_IMAGE_ID}),
    ({"mount_drop": "/engram"},
     {"what": "mount", "key": "/engram", "desired": "/home/zurih/dsv41-3x-spark/engram:/engram", "actual": None}),
    ({"mount_rw": "/models/DeepSeek-V4.1-Flash"},
     {"what": "mount", "key": "/models/DeepSeek-V4.1-Flash", "desired": "dsv41-weights:/models/DeepSeek-V4.1-Flash:ro",
      "actual": "dsv41-weights:/models/DeepSeek-V4.1-Flash"}),
], ids=["switch-missing", "key-added-by-hand", "image-key-overridden", "wrong-rank", "image", "mount-missing",
        "mount-writable"])
def test_a_differing_container_is_planned_as_recreate_and_the_difference_named(docker, change, difference):
    env, mounts = dict(ENV), list(MOUNTS)
    if "env_drop" in change:
        env.pop(change["env_drop"])
    if "env_add" in change:
        key, value = change["env_add"]
        env[key] = value
    if "mount_drop" in change:
        mounts = [m for m in mounts if not m.split(":")[1] == change["mount_drop"]]
    if "mount_rw" in change:
        mounts = [m[:-3] if m.split(":")[1] == change["mount_rw"] else m for m in mounts]
    docker.images["old"] = {"Id": NEW_IMAGE_ID, "Config": {"Env": list(IMAGE_ENV)}}
    docker.add_container("dsv41-worker", env, mounts, image=change.get("image", IMAGE_ID), log=["old boot"])

    checked = run_module(MODULE, args(), check_mode=True, diff=True).result
    assert checked["action"] == "recreate" and checked["differences"] == [difference]
    assert docker.mutating() == []

    out = run_module(MODULE, args())
    assert out.failed and out.result["action"] == "recreate" and out.result["differences"] == [difference]
    assert "different from the desired one (1 difference" in out.result["msg"]
    assert docker.mutating() == [], "only community.docker.docker_container recreates"


def test_a_stopped_matching_container_is_started_not_recreated(docker):
    docker.add_container("dsv41-worker", ENV, MOUNTS, running=False, log=["old 1", "old 2", "old 3"])
    out = run_module(MODULE, args()).result
    assert (out["action"], out["log_offset"]) == ("start", 3)
    assert [c[0] for c in docker.mutating()] == ["start"]


def test_restart_stops_and_starts_a_running_container(docker):
    docker.add_container("dsv41-worker", ENV, MOUNTS, log=["old"])
    out = run_module(MODULE, args(restart=True)).result
    assert out["action"] == "restart" and [c[0] for c in docker.mutating()] == ["stop", "start"]


@pytest.mark.parametrize("running, action", [(True, "stop"), (False, "none")])
def test_stopped_state(docker, running, action):
    docker.add_container("dsv41-head", ENV, MOUNTS, running=running)
    out = run_module(MODULE, {"name": "dsv41-head", "state": "stopped", "stop_timeout": 5}).result
    assert out["action"] == action and out["changed"] is (action != "none")
    assert docker.mutating() == ([["stop", "-t", "5", "dsv41-head"]] if running else [])
    assert "dsv41-head" in docker.containers, "stopping keeps the container and its log"


# ---------------------------------------------------------------- waiting for the ready line

def test_waits_for_the_ready_line_of_this_boot_only(docker):
    docker.add_container("dsv41-head", ENV, MOUNTS, running=False, log=["old boot", READY, "[NCCL] Watchdog ..."])
    docker.on_start = lambda name: ["dsv41 boot: rank=0"]
    docker.log_script = [[], ["Rendezvous complete: 3 ranks"], [READY]]
    out = run_module(MODULE, args(name="dsv41-head", wait_for="^.*Ready: API on port",
                                  wait_timeout=30))
    assert not out.failed, out.result
    r = out.result
    assert (r["action"], r["log_offset"], r["ready"], r["ready_line"]) == ("start", 3, True, READY)
    assert r["log_tail"] == ["dsv41 boot: rank=0", "Rendezvous complete: 3 ranks", READY]
    assert docker.log_script == [], "the old boot's ready line must not end the wait"


def test_a_head_that_exits_fails_with_its_last_lines_and_exit_code(docker):
    error = "RuntimeError: CUDA error: out of memory (NV_ERR_NO_MEMORY) while reserving the static pool"
    docker.add_container("dsv41-head", ENV, MOUNTS, running=False, log=["old boot"])
    docker.on_start = lambda name: ["dsv41 boot: rank=0", error]
    docker.log_script = [[], "exit"]
    out = run_module(MODULE, args(name="dsv41-head", wait_for="^.*Ready: API on port",
                                  wait_timeout=30))
    assert out.failed
    r = out.result
    assert r["exit_code"] == 1 and r["ready"] is False and r["log_tail"][-1] == error
    first, *rest = r["msg"].splitlines()
    assert first == "dsv41-head: the container exited with code 1 before printing a line matching '^.*Ready: API on port'"
    assert rest[-1] == error


def test_check_mode_does_not_wait(docker):
    out = run_module(MODULE, args(wait_for="Ready"), check_mode=True)
    assert out.result["ready"] is None and "wait_s" not in out.result


def test_wait_times_out_on_a_running_container():
    fake = FakeDocker()
    fake.add_container("dsv41-head", ENV, MOUNTS, log=["waiting for rank(s) [2]"])
    clock = iter(range(0, 100, 5))
    waited = ec.wait_for_line(ec.Docker(fake), "dsv41-head", "Ready", timeout=12, offset=0,
                              clock=lambda: float(next(clock)), sleep=lambda s: None)
    assert (waited.ready, waited.running, waited.tail) == (False, True, ["waiting for rank(s) [2]"])
    assert waited.seconds >= 12


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("over, text", [
    ({"image": "dsv41-3x-spark :local"}, "is not a docker image reference"),
    ({"env": {"BAD=KEY": "1"}}, "env key 'BAD=KEY' is not a valid variable name"),
    ({"env": {"EXTRA_SGLANG_ARGS": "a\nb"}}, "env value of EXTRA_SGLANG_ARGS contains a newline"),
    ({"wait_timeout": 0, "wait_for": "Ready"}, "wait_timeout must be more than 0 seconds, got 0"),
    ({"mounts": ["/state"]}, "must be SRC:DST[:ro]"),
    ({"mounts": ["/a:/x", "/b:/x"]}, "several mounts target /x"),
    ({"name": "dsv41 head"}, "container name 'dsv41 head' is not valid"),
])
def test_bad_input_fails_before_docker_is_called(docker, over, text):
    out = run_module(MODULE, args(**over))
    assert out.failed and text in out.result["msg"], out.result["msg"]
    assert docker.calls == []


def test_a_missing_image_fails_with_what_to_do(docker):
    out = run_module(MODULE, args(image="dsv41-3x-spark:canary"))
    assert out.failed
    assert "image dsv41-3x-spark:canary is not on this host; build or load it first" in out.result["msg"]
    assert docker.mutating() == []


# ---------------------------------------------------------------- engine_env filters

PER_RANK = {"NODE_RANK": "0", "MEM_FRACTION_STATIC": {0: "0.95"}}
SERVING = {"TP_SIZE": 3, "MEM_FRACTION_STATIC": "0.95", "EXTRA_SGLANG_ARGS": "", "DSV41_AUTOTUNE_KEEP": "0"}


@pytest.mark.parametrize("env, per_rank, rank, text", [
    (SERVING, {"NODE_RANK": "0", "MEM_FRACTON_STATIC": {0: "0.9"}}, 0,
     "engine_env_per_rank has an unknown key MEM_FRACTON_STATIC"),
    (SERVING, {"NODE_RANK": "0", "MEM_FRACTION_STATIC": {7: "0.9"}}, 0,
     "engine_env_per_rank.MEM_FRACTION_STATIC has an unknown rank 7 (ranks are 0..2)"),
    (SERVING, {"NODE_RANK": "0", "MEM_FRACTION_STATIC": {"head": "0.9"}}, 0, "has an unknown rank 'head'"),
    (SERVING, {"MEM_FRACTION_STATIC": {0: "0.9"}}, 0, "engine_env_per_rank must declare NODE_RANK"),
    (SERVING, {"NODE_RANK": "1"}, 0, "engine_env_per_rank.NODE_RANK gives '1' on a host whose fleet_rank is 0"),
    (dict(SERVING, **{"BAD=KEY": "1"}), PER_RANK, 0, "engine_env key 'BAD=KEY' is not a variable name"),
    (dict(SERVING, EXTRA_SGLANG_ARGS="--a\n--b"), PER_RANK, 0, "engine_env.EXTRA_SGLANG_ARGS contains a newline"),
    (dict(SERVING, DSV41_AUTOTUNE_KEEP=True), PER_RANK, 0, "engine_env.DSV41_AUTOTUNE_KEEP is a boolean"),
    (dict(SERVING, DSV41_AUTOTUNE_KEEP=None), PER_RANK, 0, "engine_env.DSV41_AUTOTUNE_KEEP has no value"),
    (SERVING, {"NODE_RANK": "0", "MEM_FRACTION_STATIC": {0: "0.9\n"}}, 0, "contains a newline"),
    ({}, PER_RANK, 0, "engine_env must be a non-empty dict"),
])
def test_engine_env_problems_name_the_bad_input(env, per_rank, rank, text):
    problems = envf.engine_env_problems(env, per_rank, rank, 3)
    assert any(text in p for p in problems), problems


def test_engine_env_problems_accept_the_inventories():
    for inventory in ("fleet", "testbed"):
        data = yaml.safe_load((ROOT / "inventory" / inventory / "group_vars/all/engine.yml").read_text())
        env = {k: ("3" if "{{" in str(v) else v) for k, v in data["engine_env"].items()}
        for rank in range(3):
            per_rank = dict(data["engine_env_per_rank"], NODE_RANK=str(rank))
            assert envf.engine_env_problems(env, per_rank, rank, 3) == [], inventory


def test_engine_env_split_keeps_per_rank_keys_out_of_the_shared_file():
    head = envf.engine_env_split(SERVING, {"NODE_RANK": "0", "MEM_FRACTION_STATIC": {"0": "0.93"}}, 0)
    worker = envf.engine_env_split(SERVING, {"NODE_RANK": "2", "MEM_FRACTION_STATIC": {"0": "0.93"}}, 2)
    assert head["shared"] == worker["shared"] == {"DSV41_AUTOTUNE_KEEP": "0", "EXTRA_SGLANG_ARGS": "", "TP_SIZE": "3"}
    assert head["rank"] == {"MEM_FRACTION_STATIC": "0.93", "NODE_RANK": "0"}
    assert worker["rank"] == {"MEM_FRACTION_STATIC": "0.95", "NODE_RANK": "2"}


def test_engine_env_parse_reads_like_docker():
    text = "#\n# Ansible managed\n#\nA=1\n\nEXTRA=--x=1 --y\nEMPTY=\n  B=2\nNOVALUE\n"
    assert envf.engine_env_parse(text) == {"A": "1", "EXTRA": "--x=1 --y", "EMPTY": "", "B": "2"}


def test_engine_env_fingerprint_covers_only_tactics_relevant_keys():
    base = {"DSV41_AUTOTUNE_KEEP": "1", "SGLANG_X": "a", "PORT": "8888", "NODE_RANK": "0"}
    fp = envf.engine_env_fingerprint(base)
    assert fp == envf.engine_env_fingerprint(dict(reversed(list(base.items()))))
    assert fp == envf.engine_env_fingerprint(dict(base, PORT="9999", NODE_RANK="2", NCCL_DEBUG="INFO"))
    assert fp != envf.engine_env_fingerprint(dict(base, DSV41_WO_A_W8="1"))


def test_engine_env_cross_rank_ignores_declared_keys():
    envs = {"spark1": {"NODE_RANK": "0", "A": "1"}, "spark2": {"NODE_RANK": "1", "A": "1"},
            "spark3": {"NODE_RANK": "2", "A": "2", "B": "x"}}
    assert envf.engine_env_cross_rank(envs, ["NODE_RANK"]) == [
        {"key": "A", "values": {"spark1": "1", "spark2": "1", "spark3": "2"}},
        {"key": "B", "values": {"spark1": None, "spark2": None, "spark3": "x"}}]


# ---------------------------------------------------------------- the two inventories

def test_testbed_serving_env_is_the_fleets_plus_simulator_keys():
    fleet = yaml.safe_load((ROOT / "inventory/fleet/group_vars/all/engine.yml").read_text())
    testbed = yaml.safe_load((ROOT / "inventory/testbed/group_vars/all/engine.yml").read_text())
    assert not [k for k in fleet["engine_env"] if k.startswith("SIM_")], "testbed keys must stay out of the fleet"
    assert {k: v for k, v in testbed["engine_env"].items() if not k.startswith("SIM_")} == fleet["engine_env"]
    assert testbed["engine_env"]["SIM_TIME_SCALE"] == "0.25"
    assert testbed["engine_env_per_rank"] == fleet["engine_env_per_rank"]
    assert fleet["engine_env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"


def test_role_defaults_mirror_the_recipe_defaults():
    defaults = yaml.safe_load((ROOT / "roles/engine_env/defaults/main.yml").read_text())["engine_env"]
    fleet = yaml.safe_load((ROOT / "inventory/fleet/group_vars/all/engine.yml").read_text())["engine_env"]
    assert {k: fleet[k] for k in defaults} == defaults



# ---------------------------------------------------------------- readiness wait and autotune retuning

RETUNE = "[2026-11-29 20:04:01 TP0] Running FlashInfer autotune with cache: /root/.cache/sglang/flashinfer/autotune/x"
RETUNE_RE = "FlashInfer autotune: per-rank caches disagree|Running FlashInfer autotune with cache:"


def _slow_boot(lines_by_poll):
    fake = FakeDocker()
    fake.add_container("dsv41-head", ENV, MOUNTS, log=["dsv41 boot: rank=0"])
    fake.log_script = list(lines_by_poll)
    return fake


def test_a_boot_that_retunes_gets_the_autotune_timeout():
    # Polls every 10 s: the retune line at 20 s, the ready line at 60 s; the ordinary timeout is 30 s.
    fake = _slow_boot([[], [], [RETUNE], [], [], [], [READY]])
    clock = iter(range(0, 1000, 10))
    waited = ec.wait_for_line(ec.Docker(fake), "dsv41-head", "Ready: API on port", timeout=30, offset=0,
                              clock=lambda: float(next(clock)), sleep=lambda s: None,
                              extend_pattern=RETUNE_RE, extended_timeout=3600)
    assert waited.ready and waited.extended and waited.extend_line == RETUNE and waited.timeout == 3600
    assert waited.seconds > 30


def test_a_boot_that_does_not_retune_keeps_the_ordinary_timeout():
    fake = _slow_boot([[], [], ["Rendezvous complete: 3 ranks"], [], [], [], [READY]])
    clock = iter(range(0, 1000, 10))
    waited = ec.wait_for_line(ec.Docker(fake), "dsv41-head", "Ready: API on port", timeout=30, offset=0,
                              clock=lambda: float(next(clock)), sleep=lambda s: None,
                              extend_pattern=RETUNE_RE, extended_timeout=3600)
    assert not waited.ready and not waited.extended and waited.timeout == 30 and waited.running


def test_the_module_reports_retuning_and_names_the_timeout_that_applied(docker):
    docker.add_container("dsv41-head", ENV, MOUNTS, running=False)
    docker.on_start = lambda name: ["dsv41 boot: rank=0", RETUNE]
    docker.log_script = [[], [READY]]
    out = run_module(MODULE, args(name="dsv41-head", wait_for="Ready: API on port",
                                  wait_timeout=30, wait_extend_for=RETUNE_RE, wait_extended_timeout=3600))
    assert not out.failed, out.result
    assert out.result["retuning"] is True and out.result["retuning_line"] == RETUNE
    assert out.result["wait_timeout_s"] == 3600


def test_an_extended_timeout_below_the_ordinary_one_is_refused(docker):
    out = run_module(MODULE, args(wait_for="Ready", wait_timeout=900, wait_extended_timeout=60))
    assert out.failed and "wait_extended_timeout (60 s) must not be less than wait_timeout (900 s)" in out.result["msg"]
    assert docker.calls == []


# ---------------------------------------------------------------- secrets (issue 19 item 13)

def test_secrets_never_appear_in_the_result_or_the_diff(docker):
    old = {**ENV, "HF_TOKEN": "hf_old_secret_1", "MY_CRED": "cred_old_2", "HTTP_PROXY": "http://bob:pw0rd@p:3128"}
    new = {**ENV, "HF_TOKEN": "hf_new_secret_3", "MY_CRED": "cred_new_4", "HTTP_PROXY": "http://bob:pw0rd@p:3128",
           "API_KEY": "k9"}
    docker.add_container("dsv41-worker", old, MOUNTS, log=["old boot"])
    for check in (True, False):
        # A real run fails (the container differs: only community.docker recreates it); neither shows a secret.
        out = run_module(MODULE, args(env=new, secret_env_keys=["MY_CRED"]), check_mode=check, diff=True)
        assert out.failed is not check
        text = json.dumps(out.result)
        assert out.result["invocation"]["module_args"]["env"]["HF_TOKEN"] == "********"
        for secret in ("hf_old_secret_1", "hf_new_secret_3", "cred_old_2", "cred_new_4", "pw0rd", '"k9"', "=k9"):
            assert secret not in text, (check, secret)
        assert {"what": "env", "key": "HF_TOKEN", "desired": "********", "actual": "********"} \
            in out.result["differences"]
        if check:
            assert "HF_TOKEN=********" in out.result["diff"]["after"]
            assert "HTTP_PROXY=http://p:3128" in out.result["diff"]["after"]
    assert docker.mutating() == []


def test_the_result_carries_the_container_as_it_is_after_the_run(docker):
    """Issue 20 item 8: `container` is the container before the run (a restarted engine's was exited by the
    fleet's stop), `container_after` the one the run left (running): record.json shows the latter."""
    docker.add_container("dsv41-worker", ENV, MOUNTS, running=False, log=["old"])
    out = run_module(MODULE, args()).result
    assert out["container"]["status"] == "exited"
    assert out["container_after"]["status"] == "running" and out["container_after"]["running"] is True
    stopped = run_module(MODULE, {"name": "dsv41-worker", "state": "stopped", "stop_timeout": 5}).result
    assert stopped["container"]["running"] is True and stopped["container_after"]["status"] == "exited"


# Issue 22 item 4: roles/engine creates and recreates through community.docker.docker_container; this module only
# starts (in order, counting the log lines a wait skips). A missing or differing container is an error naming its
# differences, never a create or recreate through the CLI.
def test_a_missing_or_differing_container_fails_without_docker_run(docker):
    docker.add_container("dsv41-worker", dict(ENV, NODE_RANK="2"), MOUNTS, running=False, log=["old boot"])
    out = run_module(MODULE, args())
    assert out.failed and docker.mutating() == []
    assert "different from the desired one (1 difference: env NODE_RANK): this module does not create containers" \
        in out.result["msg"]
    docker.containers.clear()
    missing = run_module(MODULE, args())
    assert missing.failed and "the container is missing: this module does not create containers" in missing.result["msg"]
    assert "community.docker.docker_container" in missing.result["msg"]
    assert docker.mutating() == []


def test_the_removed_create_options_are_refused(docker):
    for gone in ({"create": False}, {"env_files": ["/x.env"]}, {"run_args": ["--ipc=host"]}, {"labels": {"a": "b"}},
                 {"command": ["run"]}, {"state": "absent"}):
        out = run_module(MODULE, args(**gone))
        assert out.failed, gone
    assert docker.calls == []


def test_apply_never_creates():
    fake = FakeDocker()
    desired = ec.Desired(name="dsv41-worker", image="dsv41-3x-spark:local", env=dict(ENV))
    the_plan = ec.plan(ec.Docker(fake), desired, "started", False)
    assert the_plan.action == "create"
    with pytest.raises(ec.EngineContainerError, match="does not create"):
        ec.apply(ec.Docker(fake), desired, the_plan, 5)
    assert fake.mutating() == []
