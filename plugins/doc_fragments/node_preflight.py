# -*- coding: utf-8 -*-
# sparkfleet: the node_preflight_info options (shared with the deprecated alias node_preflight).
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
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
"""
