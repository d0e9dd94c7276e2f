"""roles/weights_volume on the real engine (issue 22 item 4): the workers' weights docker volume created with the
inventory's driver and options through community.docker, a second run changing nothing, check mode changing
nothing, and a volume that differs refused with a clear message and left intact (also while a container uses it,
even with the opt-in), replaced only with the opt-in when no container uses it."""
from __future__ import annotations

import json

import pytest

from tests.integration.conftest import play

pytestmark = [pytest.mark.testbed, pytest.mark.usefixtures("testbed", "isolated_inventory")]

BASE = {"preflight_skip": True}
NEW = "sf-weights-test"
CONFLICT = "sf-weights-conflict"
USER = "sf-weights-user"


def inspect(node, name: str) -> dict | None:
    """The volume as docker shows it, without CreatedAt (a local volume mounted from a tmpfs shows the mount's time)."""
    out = node.run(f"docker volume inspect {name}")
    return {k: v for k, v in json.loads(out.stdout)[0].items() if k != "CreatedAt"} if out.rc == 0 else None


@pytest.fixture
def spark3(host):
    node = host("spark3")
    yield node
    node.run(f"docker rm -f {USER}; docker volume rm -f {NEW} {CONFLICT}")


def test_the_seeds_weights_volume_is_as_the_inventory_says_and_nothing_changes(host):
    run = play("weights_volume.yml", extravars=BASE)
    assert run.rc == 0, run.stdout[-3000:]
    assert run.changed() == []
    plans = {r["_host"]: r["ansible_facts"]["weights_volume_result"] for r in run.results(task="Decide what to do")
             if r["_event"] == "runner_on_ok" and "ansible_facts" in r}
    assert {h: p["action"] for h, p in plans.items()} == {"spark2": "none", "spark3": "none"}, "the head has none"
    worker = inspect(host("spark2"), "dsv41-weights")
    assert worker["Driver"] == "local" and worker["Options"]["o"] == "bind"
    assert worker["Options"]["device"].endswith("/srv/models/DeepSeek-V4.1-Flash")
    assert inspect(host("spark1"), "dsv41-weights") is None


def test_a_missing_volume_is_created_with_the_inventorys_options_check_mode_first(spark3):
    extravars = dict(BASE, weights_volume_name=NEW)
    checked = play("weights_volume.yml", extravars=extravars, limit="spark3", check=True, diff=True)
    assert checked.rc == 0, checked.stdout[-3000:]
    assert ("spark3", "Create (or, opted in, recreate) the weights volume (community.docker)") in checked.changed()
    assert inspect(spark3, NEW) is None, "check mode created the volume"

    made = play("weights_volume.yml", extravars=extravars, limit="spark3")
    assert made.rc == 0, made.stdout[-3000:]
    assert [task for _, task in made.changed()] == ["Create (or, opted in, recreate) the weights volume (community.docker)"]
    volume = inspect(spark3, NEW)
    assert volume["Driver"] == "local"
    head = inspect(spark3, "dsv41-weights")["Options"]       # what testbed up made, the same inventory options
    assert volume["Options"] == head

    again = play("weights_volume.yml", extravars=extravars, limit="spark3")
    assert again.rc == 0 and again.changed() == [], again.stdout[-3000:]


def test_a_differing_volume_is_refused_and_left_intact_even_with_the_opt_in_while_used(spark3):
    spark3.check_output(f"docker volume create --driver local --opt type=tmpfs --opt device=tmpfs --opt o=size=1m "
                        f"{CONFLICT}")
    before = inspect(spark3, CONFLICT)
    extravars = dict(BASE, weights_volume_name=CONFLICT)

    refused = play("weights_volume.yml", extravars=extravars, limit="spark3")
    assert refused.rc != 0 and refused.changed() == []
    msg = next(r["msg"] for r in refused.results(task="Refuse to touch") if r["_event"] == "runner_on_failed")
    assert msg.startswith(f"spark3: docker volume {CONFLICT} exists with another driver or options than the "
                          "inventory's (driver_options.device: inventory '/run/testbed/nfs/"), msg
    assert "driver_options.o: inventory 'bind', volume 'size=1m'" in msg and "it is left as it is" in msg
    assert "weights_volume_replace=true" in msg
    assert inspect(spark3, CONFLICT) == before

    spark3.check_output(f"docker run -d --name {USER} --network none -v {CONFLICT}:/w sparkfleet/sleeper:latest")
    used = play("weights_volume.yml", extravars=dict(extravars, weights_volume_replace=True), limit="spark3")
    assert used.rc != 0 and used.changed() == []
    msg = next(r["msg"] for r in used.results(task="Refuse to touch") if r["_event"] == "runner_on_failed")
    # docker_host_info lists a container with its status line ("Up 2 seconds").
    assert f"is used by 1 container: {USER} (Up " in msg and "); it is left as it is" in msg, msg
    assert inspect(spark3, CONFLICT) == before

    spark3.check_output(f"docker rm -f {USER}")
    replaced = play("weights_volume.yml", extravars=dict(extravars, weights_volume_replace=True), limit="spark3")
    assert replaced.rc == 0, replaced.stdout[-3000:]
    assert inspect(spark3, CONFLICT)["Options"] == inspect(spark3, "dsv41-weights")["Options"]
    again = play("weights_volume.yml", extravars=dict(extravars, weights_volume_replace=True), limit="spark3")
    assert again.rc == 0 and again.changed() == [], again.stdout[-3000:]


def drift_rows(run) -> dict:
    from pathlib import Path

    items = json.loads(Path(run.run_dir, "drift.json").read_text())["items"]
    return {(node, r["item"]): r for node, rows in items.items() for r in rows or [] if r["item"].startswith("weights_volume")}


def test_drift_reports_a_missing_or_differing_weights_volume_read_only(host, spark3):
    create = "weights_volume Create (or, opted in, recreate) the weights volume (community.docker)"
    refuse = "weights_volume Refuse to touch a weights volume that differs (nothing removed)"
    seed = play("drift.yml", extravars=dict(BASE, drift_roles=["weights_volume"]))
    assert seed.rc == 0, seed.stdout[-3000:]
    rows = drift_rows(seed)
    assert set(rows) == {("spark2", create), ("spark3", create)}, "the head has no weights volume"
    assert not any(r["drifted"] for r in rows.values()), rows

    # spark3 has a volume of that name with other options; spark2 has none.
    spark3.check_output(f"docker volume create --driver local --opt type=tmpfs --opt device=tmpfs --opt o=size=1m "
                        f"{CONFLICT}")
    before = {n: inspect(host(n), CONFLICT) for n in ("spark2", "spark3")}
    run = play("drift.yml", extravars=dict(BASE, drift_roles=["weights_volume"], weights_volume_name=CONFLICT,
                                           drift_fail=True))
    assert run.rc != 0, "drift_fail fails on the drifted rows"
    rows = drift_rows(run)
    missing, differs = rows[("spark2", create)], rows[("spark3", refuse)]
    assert missing["drifted"] and missing["fix"] == "ansible-playbook playbooks/weights_volume.yml", missing
    assert differs["drifted"] and differs["actual"].startswith(
        f"failed: spark3: docker volume {CONFLICT} exists with another driver or options than the inventory's"), differs
    assert "weights_volume_replace=true" in differs["fix"]
    assert {n: inspect(host(n), CONFLICT) for n in ("spark2", "spark3")} == before, "drift changed a volume"
