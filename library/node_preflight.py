#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_preflight
short_description: Read-only preflight of one GB10 node before anything starts or changes on it
description:
  - "One call per host reads what costs GB10 fleets their days (docs/reference.md section 11) and gives every check a
    status (C(pass), C(warn), C(fail)), a one-line summary with the numbers, and the fix."
  - C(kernel) the release (C(/proc/sys/kernel/osrelease)) is in O(allowed_kernels) (exact or shell-style glob).
  - C(kho) C(kho=off) is on C(/proc/cmdline) when the release matches O(kho_kernels), and C(CmaFree) is not
    above C(CmaTotal) in C(/proc/meminfo) (the Kexec HandOver tell, RDMA registration fails at NCCL init).
  - C(driver) version and flavour of the loaded module (C(/proc/driver/nvidia/version), C(Open Kernel Module)
    means C(open)) is in O(allowed_drivers).
  - C(fragmentation) the gate, free memory in blocks of order >= O(min_order) in C(/proc/buddyinfo) must reach
    O(min_high_order_gib), else the verdict is C(reboot first); MemFree far below MemAvailable (page cache the
    GPU cannot use) is a warning; compaction counters are reported.
  - C(fabric) every O(fabric_interfaces) is up at O(fabric_mtu) and one of them holds O(fabric_address).
  - C(gid) the RoCE v2 GID index of each HCA, resolved from C(/sys/class/infiniband/<hca>/ports/*/gids/*) and
    C(gid_attrs/types/*) (the GID that is C(::ffff:<fabric_address>)); a differing O(gid_index_pin) fails.
  - C(swap) no swap (or at most O(max_swap_kb)); C(oom_daemons) none of O(oom_daemons) runs; C(shm) the size of
    C(/dev/shm); C(clocks) the SM clock lock in force (C(nvidia-smi -q -d CLOCK)).
  - C(kernel_log) C(journalctl -k -b 0) and C(-b -1) for wedge signatures (NVRM C(NV_ERR_NO_MEMORY)/0x51 and
    Xids in O(wedge_xids), mlx5 health failures, AER fatal errors). A hit in this boot makes the verdict
    C(power cycle needed).
  - The node's C(verdict) is the worst of C(start), C(fix first), C(reboot first), C(power cycle needed). The
    module does not fail on failed checks (the preflight role decides); it fails only on bad input.
version_added: "0.1.0"
author: sparkfleet contributors (!UNKNOWN)
options:
  allowed_kernels:
    description: Kernel releases this node may run (C(uname -r) strings or globs). Must not be empty when C(kernel) is checked.
    type: list
    elements: str
    default: []
  kho_kernels:
    description: Kernel releases (or globs) that enable Kexec HandOver and so need C(kho=off) on the command line.
    type: list
    elements: str
    default: []
  allowed_drivers:
    description: Allowed drivers as C(VERSION-open) or C(VERSION-proprietary). Must not be empty when C(driver) is checked.
    type: list
    elements: str
    default: []
  min_order:
    description: Smallest buddy order that counts as a large free block (10 is 4 MiB with 4 KiB pages).
    type: int
    default: 10
  min_high_order_gib:
    description: GiB that must be free in blocks of order >= O(min_order) for the gate to say C(start).
    type: float
    default: 16
  min_memfree_ratio:
    description: Warn when MemFree is below this fraction of MemAvailable (page cache the GPU cannot use).
    type: float
    default: 0.8
  fabric_address:
    description: The node's fabric IPv4 address (the inventory's C(fleet_fabric_address)).
    type: str
    default: ""
  fabric_interfaces:
    description: Interfaces that carry the fabric (the inventory's C(fleet_fabric_interfaces)).
    type: list
    elements: str
    default: []
  fabric_mtu:
    description: MTU every fabric interface must have.
    type: int
    default: 9000
  hcas:
    description:
      - RDMA devices whose GID index to resolve. Empty means every HCA whose port maps to a fabric interface.
      - A name that is not under C(/sys/class/infiniband) fails the module (bad input).
    type: list
    elements: str
    default: []
  gid_index_pin:
    description: A GID index pinned elsewhere (for example C(NCCL_IB_GID_INDEX)); the check fails when the resolved index differs. Omit for none.
    type: int
  max_swap_kb:
    description: Most swap allowed, in kB.
    type: int
    default: 0
  oom_daemons:
    description: Process names of user-space OOM killers that must not run.
    type: list
    elements: str
    default: [systemd-oomd, earlyoom, nohang, oomd]
  min_shm_gib:
    description: Smallest size of C(/dev/shm) in GiB.
    type: float
    default: 32
  clock_lock:
    description: C(locked) (the range below must be in force), C(unlocked) (no lock) or C(any).
    type: str
    choices: [locked, unlocked, any]
    default: locked
  clock_lock_min_mhz:
    description: Lowest SM clock of the expected lock.
    type: int
    default: 0
  clock_lock_max_mhz:
    description: Highest SM clock of the expected lock.
    type: int
    default: 2200
  wedge_xids:
    description: NVRM Xid codes that mark a wedge (NV_ERR_NO_MEMORY, 0x51, is always one).
    type: list
    elements: int
    default: [79, 119, 120, 154]
  previous_boot_wedge:
    description: What a wedge signature only in the previous boot's kernel log is, C(warn) (the node was power cycled since) or C(fail).
    type: str
    choices: [warn, fail]
    default: warn
  image:
    description: The engine image whose C(NCCL_VERSION) joins the parity facts (empty to skip).
    type: str
    default: ""
  checks:
    description: The checks to run (default all).
    type: list
    elements: str
    choices: [kernel, kho, driver, fragmentation, fabric, gid, swap, oom_daemons, shm, clocks, kernel_log]
    default: [kernel, kho, driver, fragmentation, fabric, gid, swap, oom_daemons, shm, clocks, kernel_log]
  advisory:
    description:
      - Checks whose failure is reported as a warning (summary prefixed C(advisory)) and does not change the
        verdict, for example C(clocks) in a run that converges the clock lock itself.
    type: list
    elements: str
    choices: [kernel, kho, driver, fragmentation, fabric, gid, swap, oom_daemons, shm, clocks, kernel_log]
    default: []
  packages:
    description: Package name globs (kernel, driver, firmware) whose installed versions and holds are reported in C(packages).
    type: list
    elements: str
    default: []
  fact_name:
    description:
      - "Also set this host fact to the node's summary (C(verdict), C(ok), C(error), C(failed_checks), C(warned_checks),
        C(lines), C(checks), C(parity), C(packages) and C(gid), the resolved GID per HCA as C(hca -> {port, index, gid, ndev})),
        on success and on bad input (then C(error) holds the message), so a caller needs no C(set_fact) task."
    type: str
  fact_labels:
    description: Keys added to the O(fact_name) fact as they are (for example the host's name and rank).
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
    description: The module only reads; check mode returns the same verdicts.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
notes:
  - Standard library only on the host, plus C(ip), C(nvidia-smi), C(journalctl) and C(docker), run concurrently.
seealso:
  - module: fleet_snapshot
"""

EXAMPLES = r"""
- name: Preflight this node
  node_preflight:
    allowed_kernels: [7.0.0-1019-nvidia]
    kho_kernels: ["7.0.0-*-nvidia"]
    allowed_drivers: [580.159.03-open]
    fabric_address: "{{ fleet_fabric_address }}"
    fabric_interfaces: "{{ fleet_fabric_interfaces }}"
    image: "{{ fleet_image }}"
  register: preflight

- name: Stop for a node that needs a power cycle
  ansible.builtin.fail:
    msg: "{{ inventory_hostname }}: {{ preflight.lines | select('search', 'FAIL') | join('; ') }}"
  when: preflight.verdict == 'power cycle needed'

- name: Only the fabric and the GID index (after a netplan change)
  node_preflight:
    checks: [fabric, gid]
    fabric_address: 192.168.100.12
    fabric_interfaces: [enp1s0f0np0]
"""

RETURN = r"""
verdict:
  description: The node's verdict, the worst of its failed checks.
  returned: success
  type: str
  sample: start
ok:
  description: Whether no check failed.
  returned: success
  type: bool
  sample: true
failed_checks:
  description: Names of the failed checks.
  returned: success
  type: list
  elements: str
  sample: [fabric]
warned_checks:
  description: Names of the checks that passed with a warning.
  returned: success
  type: list
  elements: str
  sample: []
checks:
  description: Every check with its status, verdict, summary, fix and the facts it read.
  returned: success
  type: list
  elements: dict
  sample: [{"name": "fabric", "status": "fail", "verdict": "fix first",
            "summary": "eth0 has MTU 1500, not 9000 (RDMA retries, slow prefill)",
            "fix": "ip link set dev eth0 mtu 9000 now, and keep mtu: 9000 for eth0 in netplan ...",
            "facts": {"address": "10.213.4.13", "held_by": ["eth0"]}}]
lines:
  description: 'One line per check, C(NAME: STATUS: summary FIX: fix).'
  returned: success
  type: list
  elements: str
  sample: ["kernel: PASS: kernel 7.0.0-1019-nvidia is allowed"]
parity:
  description: The values the fleet parity table compares across ranks.
  returned: success
  type: dict
  sample: {"kernel": "7.0.0-1019-nvidia", "driver": "580.159.03-open", "firmware": "rocep1s0f0 28.45.1200",
           "nccl": "2.27.7-1", "image": "sha256:0123456789a", "swap": "off", "clocks": "0-2200 MHz",
           "fragmentation": "start", "gid_index": "rocep1s0f0:3", "kho": "off"}
ansible_facts:
  description: With O(fact_name), that fact - the summary of this node (see O(fact_name)).
  returned: when fact_name is set
  type: dict
  sample: {preflight_result: {verdict: start, ok: true, error: "", gid: {rocep1s0f0: {port: 1, index: 3}}}}
packages:
  description: Installed packages matching O(packages), with their versions and whether they are held.
  returned: success
  type: dict
  sample: {"linux-image-7.0.0-1019-nvidia": {"version": "7.0.0-1019.19", "held": true}}
read_errors:
  description: Sources that could not be read, and why.
  returned: success
  type: dict
  sample: {}
"""

import socket

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.node_preflight import CHECKS, PreflightError, Request, preflight


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
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
            fact_name=dict(type="str"),
            fact_labels=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    p = module.params
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
        msg = f"node_preflight on {socket.gethostname()}: {exc}"
        extra = {}
        if p["fact_name"]:
            extra["ansible_facts"] = {p["fact_name"]: summary(None, msg, p["fact_labels"])}
        module.fail_json(msg=msg, **extra)
    if p["fact_name"]:
        result["ansible_facts"] = {p["fact_name"]: summary(result, "", p["fact_labels"])}
    module.exit_json(changed=False, **result)


def summary(result, error: str, labels: dict) -> dict:
    """The node's verdict as the preflight role keeps it (preflight_result)."""
    result = result or {}
    checks = result.get("checks") or []
    gid = next((c.get("facts", {}).get("hcas") for c in checks if c.get("name") == "gid"), None) or {}
    out = dict(labels or {})
    out.update(verdict=result.get("verdict", "not read"), ok=bool(result.get("ok", False)), error=error,
               failed_checks=result.get("failed_checks", []), warned_checks=result.get("warned_checks", []),
               lines=result.get("lines", []), checks=checks, parity=result.get("parity", {}),
               packages=result.get("packages", {}), gid=gid)
    return out


if __name__ == "__main__":
    main()
