"""module_utils/weights_volume.py (roles/weights_volume's decisions: create, keep, refuse, replace) and the inventories'
weights volume settings, including the testbed provisioning's volume being the testbed inventory's (issue 22)."""
from __future__ import annotations

import importlib.util

import jinja2
import pytest
import yaml

from tests.conftest import ROOT

from ansible.module_utils.weights_volume import differences, plan, problems

NFS = {"type": "nfs", "o": "addr=192.168.100.11,ro,nfsvers=4.2", "device": ":/home/mia/models/DeepSeek-V4.1-Flash"}
BIND = {"type": "none", "o": "bind", "device": "/run/testbed/nfs/10.213.3.11/srv/models/DeepSeek-V4.1-Flash"}


def volume(driver="local", options=None):
    return {"Name": "dsv41-weights", "Driver": driver, "Options": dict(BIND if options is None else options),
            "Mountpoint": "/var/lib/docker/volumes/dsv41-weights/_data", "Scope": "local"}


def test_an_absent_volume_is_created():
    p = plan(None, "dsv41-weights", "local", BIND, host="spark2")
    assert (p["action"], p["differences"]) == ("create", [])
    assert p["msg"] == "spark2: docker volume dsv41-weights: would create it (driver local)"


def test_a_volume_with_the_inventorys_driver_and_options_is_left_alone():
    assert plan(volume(), "dsv41-weights", "local", BIND)["action"] == "none"
    # docker stores every option as a string: an int in the inventory is the same option.
    assert plan(volume(options={"size": "8"}), "v1", "local", {"size": 8})["action"] == "none"


@pytest.mark.parametrize("existing, difference", [
    (volume(driver="nfs-csi"), {"key": "driver", "desired": "local", "actual": "nfs-csi"}),
    (volume(options=dict(BIND, device="/srv/other")),
     {"key": "driver_options.device", "desired": BIND["device"], "actual": "/srv/other"}),
    # An option the inventory does not give is a difference too (docker_volume's own comparison misses it).
    (volume(options=dict(BIND, uid="1000")), {"key": "driver_options.uid", "desired": None, "actual": "1000"}),
    (volume(options={}), {"key": "driver_options.device", "desired": BIND["device"], "actual": None}),
], ids=["driver", "option-value", "extra-option", "no-options"])
def test_a_differing_volume_is_refused_and_left_without_the_opt_in(existing, difference):
    p = plan(existing, "dsv41-weights", "local", BIND, host="spark3")
    assert p["action"] == "refuse" and difference in p["differences"]
    assert p["msg"].startswith("spark3: docker volume dsv41-weights exists with another driver or options than the "
                               "inventory's (")
    assert "it is left as it is" in p["msg"] and "weights_volume_replace=true" in p["msg"]


def test_the_opt_in_replaces_only_a_volume_no_container_uses():
    existing = volume(options=dict(BIND, device="/srv/other"))
    first = plan(existing, "dsv41-weights", "local", BIND, replace=True)
    assert first["action"] == "replace" and first["needs_users"] is True, "the users must be looked up first"
    free = plan(existing, "dsv41-weights", "local", BIND, replace=True, users=[])
    assert free["action"] == "replace" and free["needs_users"] is False
    used = plan(existing, "dsv41-weights", "local", BIND, replace=True, host="spark2",
                users=[{"Id": "c" * 64, "Names": ["/dsv41-worker"], "State": "running"},
                       {"Id": "d" * 64, "Names": ["/weights-probe"], "Status": "Exited (0) 2 minutes ago"}])
    assert used["action"] == "refuse" and used["users"] == ["dsv41-worker (running)",
                                                            "weights-probe (Exited (0) 2 minutes ago)"]
    assert "is used by 2 containers: dsv41-worker (running), weights-probe (Exited (0) 2 minutes ago)" in used["msg"]
    assert "it is left as it is" in used["msg"]


@pytest.mark.parametrize("existing, holds", [
    # A plain local volume keeps its files in docker's own storage (its Mountpoint): removing it deletes them.
    (volume(options={}), "its files live in docker's own storage (/var/lib/docker/volumes/dsv41-weights/_data)"),
    (volume(options={"size": "8"}), "its files live in docker's own storage"),
    # Another driver's remove may delete what it holds (some plugins delete the backing disk): not ours to judge.
    (volume(driver="nfs-csi"), "driver nfs-csi may delete what the volume holds"),
], ids=["plain-local", "local-without-device", "plugin-driver"])
def test_the_opt_in_never_removes_a_volume_whose_removal_deletes_its_data(existing, holds):
    for users in (None, []):
        p = plan(existing, "dsv41-weights", "local", BIND, replace=True, users=users, host="spark2")
        assert p["action"] == "refuse" and p["needs_users"] is False, p
        assert p["msg"].startswith("spark2: docker volume dsv41-weights exists with another driver or options than "
                                   "the inventory's (")
        assert holds in p["msg"] and "it is left as it is, even with weights_volume_replace=true" in p["msg"], p["msg"]


def test_the_opt_in_changes_nothing_for_a_matching_volume():
    assert plan(volume(), "dsv41-weights", "local", BIND, replace=True)["action"] == "none"


def test_differences_are_named_in_key_order():
    got = differences("local", {"type": "nfs", "o": "addr=1.2.3.4"}, volume())
    assert [d["key"] for d in got] == ["driver_options.device", "driver_options.o", "driver_options.type"]


@pytest.mark.parametrize("name, driver, options, text", [
    ("dsv41 weights", "local", BIND, "weights_volume_name 'dsv41 weights' is not a docker volume name"),
    ("dsv41-weights", "", BIND, "weights_volume_driver '' is not a docker volume driver name"),
    ("dsv41-weights", "local", ["type=nfs"], "weights_volume_driver_options must be a mapping"),
    ("dsv41-weights", "local", {"o": "bind", "device": "/x"}, "needs a type"),
    ("dsv41-weights", "local", dict(NFS, o="ro,nfsvers=4.2"), "must give the server: addr=ADDRESS"),
    ("dsv41-weights", "local", dict(NFS, device="/srv/models"), "must be :/EXPORTED/PATH"),
    ("dsv41-weights", "local", dict(BIND, device="srv/models"), "must be an absolute path"),
    ("dsv41-weights", "local", dict(BIND, o="rbind"), "must be bind (o=bind)"),
    ("dsv41-weights", "local", dict(BIND, device="/x\n/y"), "weights_volume_driver_options.device contains a newline"),
    ("dsv41-weights", "local", {"type": {"a": 1}}, "weights_volume_driver_options.type must be a single value"),
    ("dsv41-weights", "local", {"bad key": "1", "type": "tmpfs"}, "key 'bad key' is not a volume option name"),
])
def test_bad_settings_are_named(name, driver, options, text):
    found = problems(name, driver, options)
    assert any(text in p for p in found), found


def _inventory(which: str, head_ip: str) -> dict:
    fleet = yaml.safe_load((ROOT / "inventory" / which / "group_vars/all/fleet.yml").read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    facts = dict(fleet, fleet_head_ip=head_ip)
    return {k: env.from_string(v).render(facts) if isinstance(v, str) else v
            for k, v in fleet["fleet_weights_volume_options"].items()}, fleet


@pytest.mark.parametrize("which", ["fleet", "testbed"])
def test_both_inventories_give_valid_settings(which):
    options, fleet = _inventory(which, "10.213.3.11")
    assert problems(fleet["fleet_weights_volume"], fleet["fleet_weights_volume_driver"], options) == []
    assert options["type"] == {"fleet": "nfs", "testbed": "none"}[which]


def test_the_testbed_provisions_the_volume_the_testbed_inventory_asks_for(monkeypatch):
    """testbed up makes dsv41-weights on the workers (the fleet as found: the seed's engine containers use it);
    roles/weights_volume then finds it as the inventory says and changes nothing."""
    monkeypatch.syspath_prepend(str(ROOT / "testbed"))   # provision.py runs in the hosts, the simulator beside it
    spec = importlib.util.spec_from_file_location("sparkfleet_tb_provision", ROOT / "testbed" / "provision.py")
    provision = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(provision)
    calls = []
    monkeypatch.setattr(provision, "sh", lambda *argv: calls.append(argv) or "")
    provision.weights_volume({"rank": 1, "head_address": "10.213.3.11"})
    (argv,) = calls
    made = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--opt")
    options, fleet = _inventory("testbed", "10.213.3.11")
    assert argv[argv.index("--driver") + 1] == fleet["fleet_weights_volume_driver"]
    assert made == options and argv[-1] == fleet["fleet_weights_volume"]
