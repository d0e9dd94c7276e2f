"""roles/quiesce: the quiesce_workloads module (library/) and its module_utils, against a small
in-memory host whose docker and systemctl behave like the real CLIs at the interface the module uses."""
from __future__ import annotations

import json
from unittest import mock

import pytest

from ansible.module_utils import basic
from ansible.module_utils import quiesce_workloads as q
from tests.conftest import load_module
from tests.unit.module_harness import run_module

MODULE = load_module("quiesce_workloads")


class FakeHost:
    """Containers {name: [image, image_id, state]} and services {name: active}; mutating verbs change them."""

    def __init__(self, containers: dict, services: dict | None = None, fail_on: tuple = ()):
        self.containers = {k: list(v) for k, v in containers.items()}
        self.services = dict(services or {})
        self.fail_on = fail_on
        self.calls = []

    def mutations(self) -> list:
        return [c for c in self.calls if c[1] in ("pause", "unpause", "stop", "start")]

    def __call__(self, argv):
        argv = tuple(argv)
        self.calls.append(argv)
        if argv in self.fail_on:
            return 1, "", f"Error response from daemon: {argv[-1]} broke"
        if argv[:2] == ("docker", "ps"):
            return 0, "".join(f"id-{n}\n" for n in self.containers), ""
        if argv[:2] == ("docker", "inspect"):
            out = []
            for cid in argv[4:]:
                name = cid[3:]
                image, image_id, state = self.containers[name]
                out.append({"Id": cid + "0" * 20, "Name": "/" + name, "Image": image_id, "State": {"Status": state},
                            "Config": {"Image": image, "Labels": {"owner": "zurih"}}})
            return 0, json.dumps(out), ""
        if argv[:3] == ("docker", "image", "inspect"):
            ids = {c[0]: c[1] for c in self.containers.values()}
            return (0, ids[argv[-1]] + "\n", "") if argv[-1] in ids else (1, "", "No such image")
        if argv[0] == "docker":
            verb, name = argv[1], argv[2]
            row = self.containers[name]
            row[2] = {"pause": "paused", "unpause": "running", "stop": "exited", "start": "running"}[verb]
            return 0, name + "\n", ""
        if argv[:2] == ("systemctl", "is-active"):
            state = self.services.get(argv[2])
            return (0 if state == "active" else 3), (state or "inactive") + "\n", ""
        if argv[:2] == ("systemctl", "is-enabled"):
            if argv[2] not in self.services:
                return 1, "", f"ERROR:systemctl:Unit {argv[2]} not found.\n"
            return 0, "enabled\n", ""
        if argv[0] == "systemctl":
            self.services[argv[2]] = "active" if argv[1] == "start" else "inactive"
            return 0, "", ""
        raise AssertionError(f"unexpected command {argv}")


def homelab(**states) -> FakeHost:
    containers = {"grafana": ["grafana/grafana:11.2.0", "sha256:g", "running"],
                  "redis": ["redis:7.4", "sha256:r", "running"],
                  "ollama": ["ollama/ollama:0.3.12", "sha256:o", "running"],
                  "dsv41-worker": ["dsv41-3x-spark:local", "sha256:fleet", "running"],
                  "canary": ["mia/canary:1", "sha256:fleet", "running"]}
    for name, state in states.items():
        containers[name][2] = state
    return FakeHost(containers, {"gpu-dashboard.service": "active"})


# ------------------------------------------------------------------ module_utils


def test_normalize_accepts_names_and_dicts():
    entries = q.normalize(["grafana", {"name": "ollama", "action": "stop"},
                           {"name": "gpu-dashboard.service", "kind": "service"}])
    assert entries == [q.Entry("grafana", "container", "pause"), q.Entry("ollama", "container", "stop"),
                       q.Entry("gpu-dashboard.service", "service", "stop")]
    assert q.normalize(["grafana"], default_action="stop") == [q.Entry("grafana", "container", "stop")]


@pytest.mark.parametrize("raw, needle", [
    ([{"name": "x", "kind": "service", "action": "pause"}], "a service cannot be paused"),
    ([{"name": "x", "action": "kill"}], "action must be pause or stop"),
    ([{"name": "x", "kind": "vm"}], "kind must be container or service"),
    ([{"name": "x", "when": "now"}], "unknown keys when"),
    (["x", "x"], "listed twice"),
    ([{"action": "stop"}], "needs a name"),
    ([42], "needs a name"),
])
def test_normalize_rejects_bad_entries(raw, needle):
    with pytest.raises(q.QuiesceError, match=needle):
        q.normalize(raw)


def test_plan_quiet_pauses_running_and_records_only_what_it_does():
    host = homelab(redis="paused")
    containers = q.inventory_containers(host)
    plan = q.plan("quiet", q.normalize(["grafana", "redis", "jellyfin"]), None, containers, {})
    assert [a.as_dict() for a in plan.actions] == [
        {"name": "grafana", "kind": "container", "verb": "pause", "from": "running", "to": "paused"}]
    # redis was paused by someone else: quiet already, not ours to resume.
    assert plan.record == {"version": 1, "state": "quiet",
                           "actions": [{"name": "grafana", "kind": "container", "action": "pause", "from": "running"}]}
    assert plan.unknown == ["jellyfin"] and plan.not_quiet == ["grafana"]


def test_plan_quiet_keeps_the_record_and_repairs_drift():
    record = {"version": 1, "state": "quiet", "actions": [
        {"name": "grafana", "kind": "container", "action": "pause", "from": "running"},
        {"name": "redis", "kind": "container", "action": "pause", "from": "running"}]}
    host = homelab(redis="paused")  # grafana was unpaused by hand
    plan = q.plan("quiet", q.normalize(["grafana", "redis"]), record, q.inventory_containers(host), {})
    assert [(a.verb, a.name) for a in plan.actions] == [("pause", "grafana")]
    assert plan.record == record


def test_plan_quiet_puts_back_what_is_no_longer_listed():
    record = {"version": 1, "state": "quiet", "actions": [
        {"name": "grafana", "kind": "container", "action": "pause", "from": "running"},
        {"name": "ollama", "kind": "container", "action": "stop", "from": "running"}]}
    host = homelab(grafana="paused", ollama="exited")
    plan = q.plan("quiet", q.normalize(["grafana"]), record, q.inventory_containers(host), {})
    assert [(a.verb, a.name) for a in plan.actions] == [("start", "ollama")]
    assert [r["name"] for r in plan.record["actions"]] == ["grafana"]


def test_plan_stop_and_services():
    host = homelab(ollama="paused")
    services = {"gpu-dashboard.service": q.service_state(host, "gpu-dashboard.service")}
    entries = q.normalize([{"name": "ollama", "action": "stop"}, {"name": "gpu-dashboard.service", "kind": "service"}])
    plan = q.plan("quiet", entries, None, q.inventory_containers(host), services)
    assert [(a.verb, a.name, a.before, a.after) for a in plan.actions] == [
        ("stop", "ollama", "paused", "exited"), ("stop", "gpu-dashboard.service", "active", "inactive")]


def test_plan_restored_undoes_exactly_the_record():
    record = {"version": 1, "state": "quiet", "actions": [
        {"name": "grafana", "kind": "container", "action": "pause", "from": "running"},
        {"name": "ollama", "kind": "container", "action": "stop", "from": "running"},
        {"name": "redis", "kind": "container", "action": "pause", "from": "running"},
        {"name": "gone", "kind": "container", "action": "pause", "from": "running"}]}
    host = homelab(grafana="paused", ollama="exited")  # redis was resumed by hand already
    plan = q.plan("restored", q.normalize(["grafana"]), record, q.inventory_containers(host), {})
    assert [(a.verb, a.name) for a in plan.actions] == [("unpause", "grafana"), ("start", "ollama")]
    assert plan.record is None and plan.unknown == ["gone"]


def test_protected_by_name_and_by_fleet_image():
    host = homelab()
    containers = q.inventory_containers(host)
    reasons = q.protected(q.normalize(["grafana", "dsv41-worker", "canary"]), containers, ["dsv41-worker"],
                          ["dsv41-3x-spark:local"], q.image_ids(host, ["dsv41-3x-spark:local"]))
    assert reasons == ["dsv41-worker (a serving container)", "canary (runs the fleet image mia/canary:1)"]


# ------------------------------------------------------------------ the module


@pytest.fixture
def world(tmp_path):
    holder = {"host": homelab()}

    def run_command(self, argv, **kwargs):
        return holder["host"](argv)
    with mock.patch.object(basic.AnsibleModule, "run_command", run_command):
        yield holder, tmp_path / "var" / "quiesce.json"


def args(state_file, **extra) -> dict:
    return {"state_file": str(state_file), "dispensable": ["grafana", "redis", {"name": "ollama", "action": "stop"}],
            "protected_images": ["dsv41-3x-spark:local"], "protected_names": ["dsv41-head", "dsv41-worker"], **extra}


def test_check_mode_reports_the_diff_and_changes_nothing(world):
    holder, state_file = world
    out = run_module(MODULE, args(state_file), check_mode=True, diff=True)
    assert not out.failed, out.result
    assert out.result["changed"] is True
    assert [(a["verb"], a["name"]) for a in out.result["actions"]] == [("pause", "grafana"), ("pause", "redis"),
                                                                      ("stop", "ollama")]
    workloads, record = out.result["diff"]
    assert workloads["before"] == ("container grafana: running\ncontainer ollama: running\n"
                                   "container redis: running\n")
    assert workloads["after"] == "container grafana: paused\ncontainer ollama: exited\ncontainer redis: paused\n"
    assert record["before"] == "" and '"name": "ollama"' in record["after"]
    assert holder["host"].mutations() == [] and not state_file.exists()


def test_quiet_then_again_then_restored(world):
    holder, state_file = world
    first = run_module(MODULE, args(state_file)).result
    assert first["changed"] and {n: r[2] for n, r in holder["host"].containers.items()} == {
        "grafana": "paused", "redis": "paused", "ollama": "exited", "dsv41-worker": "running", "canary": "running"}
    record = json.loads(state_file.read_text())
    assert record == first["record"] and len(record["actions"]) == 3

    second = run_module(MODULE, args(state_file)).result
    assert second["changed"] is False and second["actions"] == [] and second["not_quiet"] == []

    restored = run_module(MODULE, args(state_file, state="restored")).result
    assert restored["changed"] and not state_file.exists()
    assert all(r[2] == "running" for r in holder["host"].containers.values())
    assert run_module(MODULE, args(state_file, state="restored")).result["changed"] is False


@pytest.mark.parametrize("listed, needle", [
    (["grafana", "dsv41-worker"], "dsv41-worker (a serving container)"),
    (["canary"], "canary (runs the fleet image mia/canary:1)"),
])
def test_serving_containers_are_refused_before_any_change(world, listed, needle):
    holder, state_file = world
    out = run_module(MODULE, args(state_file, dispensable=listed))
    assert out.failed and needle in out.result["msg"] and "never paused or stopped" in out.result["msg"]
    assert holder["host"].mutations() == [] and not state_file.exists()


def test_unknown_names_warn_and_are_skipped(world):
    holder, state_file = world
    with mock.patch.object(basic.AnsibleModule, "warn") as warn:
        out = run_module(MODULE, args(state_file, dispensable=["grafana", "jellyfin"]))
    assert not out.failed and out.result["unknown"] == ["jellyfin"]
    assert "jellyfin" in warn.call_args[0][0] and "skipped" in warn.call_args[0][0]
    assert [a["name"] for a in out.result["actions"]] == ["grafana"]


def test_a_failed_command_keeps_what_was_done_in_the_record(world):
    holder, state_file = world
    holder["host"].fail_on = (("docker", "pause", "redis"),)
    out = run_module(MODULE, args(state_file))
    assert out.failed and "1 of 3 actions done" in out.result["msg"] and "redis broke" in out.result["msg"]
    assert [r["name"] for r in json.loads(state_file.read_text())["actions"]] == ["grafana"]


def test_a_broken_record_is_reported(world):
    holder, state_file = world
    state_file.parent.mkdir(parents=True)
    state_file.write_text("{not json")
    out = run_module(MODULE, args(state_file))
    assert out.failed and "is not JSON" in out.result["msg"] and holder["host"].mutations() == []


def test_the_protected_names_come_from_the_role(tmp_path):
    # No built-in container names (issue 25 item 4): the role passes quiesce_protected_containers.
    out = run_module(MODULE, {"state_file": str(tmp_path / "quiesce.json")})
    assert out.failed and "missing required arguments: protected_names" in out.result["msg"]
