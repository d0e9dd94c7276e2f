"""Host keys are verified for the real fleet (issue 19 item 14): only the testbed inventory turns checking off.

ansible.cfg applies to every inventory, so it must not disable checking; the testbed says so in its own
group_vars (ansible_ssh_common_args). The fleet inventory is resolved with ansible-inventory, as a play sees it.
"""
import configparser
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_INVENTORY = Path(sys.executable).parent / "ansible-inventory"
# Options that make ssh accept any host key (or forget the one it saw).
DISABLING = ("stricthostkeychecking=no", "stricthostkeychecking no", "stricthostkeychecking=off",
             "stricthostkeychecking=accept-new", "userknownhostsfile=/dev/null")


def _disables(args: str) -> list:
    text = " ".join(str(args or "").lower().split())
    return [opt for opt in DISABLING if opt in text]


def _resolved_hosts(inventory: str) -> dict:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), SPARKFLEET_TESTBED_ID="3")
    out = subprocess.run([str(ANSIBLE_INVENTORY), "-i", str(ROOT / "inventory" / inventory), "--list"],
                         cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    hostvars = json.loads(out)["_meta"]["hostvars"]
    return {h: v for h, v in hostvars.items() if h != "localhost"}


def _cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ROOT / "ansible.cfg")
    return cfg


def test_ansible_cfg_does_not_disable_host_key_checking():
    cfg = _cfg()
    checking = cfg.get("defaults", "host_key_checking", fallback="True")
    assert checking.strip().lower() not in ("false", "no", "0", "off"), "ansible.cfg sets host_key_checking off"
    for option in ("ssh_args", "ssh_common_args", "ssh_extra_args"):
        assert not _disables(cfg.get("ssh_connection", option, fallback="")), \
            f"ansible.cfg [ssh_connection] {option} disables host-key checking for every inventory"


@pytest.mark.skipif(not ANSIBLE_INVENTORY.exists(), reason="ansible-inventory not in the venv")
def test_fleet_inventory_verifies_host_keys():
    # What ssh gets for a fleet host: ansible.cfg's ssh_args (or the host's ansible_ssh_args) plus the host's own.
    cfg = _cfg()
    hosts = _resolved_hosts("fleet")
    assert {"spark1", "spark2", "spark3"} <= set(hosts)
    for host, hv in hosts.items():
        effective = " ".join(str(hv.get(var, "")) for var in ("ansible_ssh_common_args", "ansible_ssh_extra_args"))
        effective += " " + str(hv.get("ansible_ssh_args", cfg.get("ssh_connection", "ssh_args", fallback="")))
        assert not _disables(effective), f"inventory/fleet {host}: ssh gets {_disables(effective)}"
        checking = hv.get("ansible_host_key_checking", cfg.get("defaults", "host_key_checking", fallback="True"))
        assert str(checking).lower() not in ("false", "no", "0", "off"), f"inventory/fleet {host}: checking off"


@pytest.mark.skipif(not ANSIBLE_INVENTORY.exists(), reason="ansible-inventory not in the venv")
def test_testbed_inventory_turns_checking_off_itself():
    # The testbed's keys are new at every `testbed/fleet up`: its own inventory must say so, or nothing connects.
    for host, hv in _resolved_hosts("testbed").items():
        assert "stricthostkeychecking=no" in _disables(hv.get("ansible_ssh_common_args")), host
