#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_preflight_info
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
  - Returns no C(ansible_facts) (a read-only module is named C(*_info)); the preflight role keeps the node's summary as
    the host fact C(preflight_result) with the C(preflight_node_result) filter (plugins/filter/preflight.py).
version_added: "0.1.0"
author: sparkfleet contributors (!UNKNOWN)
extends_documentation_fragment:
  - node_preflight
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
  - module: fleet_snapshot_info
"""

EXAMPLES = r"""
- name: Preflight this node
  node_preflight_info:
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
  node_preflight_info:
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

from ansible.module_utils.node_preflight_module import run_module


def main() -> None:
    run_module("node_preflight_info")


if __name__ == "__main__":
    main()
