"""module_utils/docker_options.py: the recipe's docker run flags as community.docker.docker_container options, and the
rank's boot plan joined from the project's comparison and docker_container's (issue 22 item 4)."""
from __future__ import annotations

import pytest
import yaml

from tests.conftest import ROOT

from ansible.module_utils.docker_options import (
    COMPARISONS,
    DockerOptionsError,
    container_options,
    docker_would,
    rank_plan,
)

GPU_ALL = [{"driver": "", "count": -1, "capabilities": [["gpu"]], "options": {}}]


def test_the_roles_default_flags_become_the_options_docker_run_gives():
    flags = yaml.safe_load((ROOT / "roles/engine/defaults/main.yml").read_text())["engine_run_args"]
    assert container_options(flags) == {
        "network_mode": "host", "ipc_mode": "host", "privileged": True, "capabilities": ["IPC_LOCK"],
        # docker's CLI sends --gpus all as Driver "", Count -1, Capabilities [[gpu]], Options {}: the same request,
        # so a container the recipe's launch line made compares equal (Options null would differ).
        "device_requests": GPU_ALL, "shm_size": "32g",
        # --ulimit NAME=SOFT means SOFT:SOFT, as docker run reads it.
        "ulimits": ["memlock:-1:-1", "stack:67108864:67108864"], "devices": ["/dev/infiniband"]}


@pytest.mark.parametrize("flags, options", [
    (["--network", "host", "--ipc", "host"], {"network_mode": "host", "ipc_mode": "host"}),
    (["--restart=on-failure:3"], {"restart_policy": "on-failure", "restart_retries": 3}),
    (["--restart", "unless-stopped"], {"restart_policy": "unless-stopped"}),
    (["--gpus", "2"], {"device_requests": [{"driver": "", "count": 2, "capabilities": [["gpu"]], "options": {}}]}),
    (["--gpus=device=0,1"], {"device_requests": [{"driver": "", "device_ids": ["0", "1"], "capabilities": [["gpu"]],
                                                  "options": {}}]}),
    (["--device=/dev/infiniband:/dev/infiniband", "--device", "/dev/fuse"],
     {"devices": ["/dev/infiniband:/dev/infiniband", "/dev/fuse"]}),
    (["--cap-add=SYS_PTRACE", "--cap-add=IPC_LOCK", "--cap-add=IPC_LOCK"], {"capabilities": ["IPC_LOCK", "SYS_PTRACE"]}),
    (["--privileged=false"], {"privileged": False}),
    ([], {}),
])
def test_each_flag_spelling(flags, options):
    assert container_options(flags) == options


@pytest.mark.parametrize("flags, text", [
    (["-e", "A=1"], "docker run flag '-e' has no docker_container option here"),
    (["-v", "/a:/b"], "docker run flag '-v'"),
    (["--network"], "--network needs a value"),
    (["--network", "--ipc=host"], "--network needs a value"),
    (["--network=host", "--network=bridge"], "--network is given twice ('host' and 'bridge')"),
    (["--gpus=most"], "--gpus 'most': use all, a count, or device=ID[,ID]"),
    (["--ulimit=memlock"], "--ulimit 'memlock': use NAME=SOFT[:HARD]"),
    (["--shm-size=lots"], "--shm-size 'lots'"),
    (["--restart=sometimes"], "--restart 'sometimes'"),
])
def test_a_flag_without_an_option_is_refused_by_name(flags, text):
    with pytest.raises(DockerOptionsError) as err:
        container_options(flags)
    assert text in str(err.value)


def test_comparisons_are_strict_where_the_recipe_needs_it_and_mounts_are_the_projects():
    assert {k: COMPARISONS[k] for k in ("image", "env", "devices", "device_requests", "ulimits")} == dict.fromkeys(
        ("image", "env", "devices", "device_requests", "ulimits"), "strict")
    # A bind made by `docker run -v SRC:DST` reads as SRC:DST to the module, which expects SRC:DST:rw: the mounts
    # are compared by engine_container (normalised), which feeds the rank's plan.
    assert COMPARISONS["volumes"] == "ignore" and COMPARISONS["labels"] == "ignore"


RECREATE = {"changed": True, "actions": [{"stopped": "4f2c"}, {"removed": "4f2c"}, {"created": "77ab"}],
            "diff": {"differences": [{"shm_size": {"parameter": 17179869184, "container": 34359738368}},
                                     {"ulimits": {"parameter": [], "container": []}}]}}


@pytest.mark.parametrize("result, would", [
    (None, "none"), ({}, "none"), ({"skipped": True, "changed": False}, "none"),
    ({"changed": False, "actions": []}, "none"), (RECREATE, "recreate"),
    ({"changed": True, "actions": [{"created": "77ab"}]}, "create"),
    # no_log censors the result; "changed" survives: a change of an existing container is a recreate.
    ({"changed": True, "censored": "the output has been hidden"}, "recreate"),
])
def test_what_docker_container_would_do(result, would):
    assert docker_would(result) == would


def test_the_rank_is_recreated_when_only_docker_container_sees_a_difference():
    plan = rank_plan({"action": "none", "differences": []}, RECREATE)
    assert plan["action"] == "recreate" and plan["docker_differences"] == ["shm_size", "ulimits"]
    assert [(d["what"], d["key"]) for d in plan["differences"]] == [("option", "shm_size"), ("option", "ulimits")]
    # A stopped rank that differs only in an option is recreated too, not just started.
    assert rank_plan({"action": "start", "differences": []}, RECREATE)["action"] == "recreate"


def test_the_projects_plan_stands_when_docker_container_agrees_or_was_not_asked():
    env_diff = {"what": "env", "key": "DSV41_ENGRAM_PREFETCH", "desired": "1", "actual": None}
    assert rank_plan({"action": "recreate", "differences": [env_diff]},
                     {"changed": True, "actions": [{"removed": "x"}], "diff": {"differences": [{"env": {}}]}}) == {
        "action": "recreate", "differences": [env_diff], "docker_differences": ["env"]}
    assert rank_plan({"action": "create", "differences": []}, {}) == {
        "action": "create", "differences": [], "docker_differences": []}
    assert rank_plan({"action": "none", "differences": []}, {"changed": False})["action"] == "none"
    assert rank_plan(None, None) == {"action": "none", "differences": [], "docker_differences": []}


def test_a_censored_recreate_still_names_a_row():
    plan = rank_plan({"action": "none"}, {"changed": True, "censored": "hidden"})
    assert plan["action"] == "recreate" and plan["differences"] == [
        {"what": "option", "key": "configuration", "desired": "(recipe)", "actual": "(differs)"}]
