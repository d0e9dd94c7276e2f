# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of the node_preflight_info module (and of its deprecated alias node_preflight, which alone keeps the
options fact_name/fact_labels and returns the summary as ansible_facts). The checks: node_preflight.py."""
from __future__ import annotations

import socket

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.module_alias import warn_if_deprecated
from ansible.module_utils.node_preflight import CHECKS, PreflightError, Request, preflight
from ansible.module_utils.node_preflight_result import summary

ALIAS_WITH_FACTS = "node_preflight"


def argument_spec(name: str) -> dict:
    spec = dict(
        allowed_kernels=dict(type="list", elements="str", default=[]),
        kho_kernels=dict(type="list", elements="str", default=[]),
        allowed_drivers=dict(type="list", elements="str", default=[]),
        min_order=dict(type="int", default=10),
        min_high_order_gib=dict(type="float", default=16.0),
        min_memfree_ratio=dict(type="float", default=0.8),
        fabric_address=dict(type="str", default=""),
        fabric_interfaces=dict(type="list", elements="str", default=[]),
        fabric_mtu=dict(type="int", default=9000),
        hcas=dict(type="list", elements="str", default=[]),
        gid_index_pin=dict(type="int"),
        max_swap_kb=dict(type="int", default=0),
        oom_daemons=dict(type="list", elements="str", default=["systemd-oomd", "earlyoom", "nohang", "oomd"]),
        min_shm_gib=dict(type="float", default=32.0),
        clock_lock=dict(type="str", default="locked", choices=["locked", "unlocked", "any"]),
        clock_lock_min_mhz=dict(type="int", default=0),
        clock_lock_max_mhz=dict(type="int", default=2200),
        wedge_xids=dict(type="list", elements="int", default=[79, 119, 120, 154]),
        previous_boot_wedge=dict(type="str", default="warn", choices=["warn", "fail"]),
        image=dict(type="str", default=""),
        checks=dict(type="list", elements="str", default=list(CHECKS), choices=list(CHECKS)),
        advisory=dict(type="list", elements="str", default=[], choices=list(CHECKS)),
        packages=dict(type="list", elements="str", default=[]),
    )
    if name == ALIAS_WITH_FACTS:
        spec.update(fact_name=dict(type="str"), fact_labels=dict(type="dict", default={}))
    return spec


def run_module(name: str) -> None:
    """Preflight this node as the module's arguments say and exit with the verdicts."""
    module = AnsibleModule(argument_spec=argument_spec(name), supports_check_mode=True)
    warn_if_deprecated(module, name)
    p = module.params
    fact_name = p.get("fact_name")
    request = Request(
        allowed_kernels=tuple(p["allowed_kernels"]), kho_kernels=tuple(p["kho_kernels"]),
        allowed_drivers=tuple(p["allowed_drivers"]), min_order=p["min_order"],
        min_high_order_gib=p["min_high_order_gib"], min_memfree_ratio=p["min_memfree_ratio"],
        fabric_address=p["fabric_address"], fabric_interfaces=tuple(p["fabric_interfaces"]),
        fabric_mtu=p["fabric_mtu"], hcas=tuple(p["hcas"]), gid_index_pin=p["gid_index_pin"],
        max_swap_kb=p["max_swap_kb"], oom_daemons=tuple(p["oom_daemons"]), min_shm_gib=p["min_shm_gib"],
        clock_lock=p["clock_lock"], clock_lock_min_mhz=p["clock_lock_min_mhz"],
        clock_lock_max_mhz=p["clock_lock_max_mhz"], wedge_xids=tuple(p["wedge_xids"]),
        previous_boot_wedge=p["previous_boot_wedge"], image=p["image"], checks=tuple(p["checks"]),
        advisory=tuple(p["advisory"]), packages=tuple(p["packages"]))
    try:
        result = preflight(request)
    except PreflightError as exc:
        msg = f"{name} on {socket.gethostname()}: {exc}"
        extra = {}
        if fact_name:
            extra["ansible_facts"] = {fact_name: summary(None, msg, p["fact_labels"])}
        module.fail_json(msg=msg, **extra)
    if fact_name:
        result["ansible_facts"] = {fact_name: summary(result, "", p["fact_labels"])}
    module.exit_json(changed=False, **result)
