#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_snapshot_info
short_description: One read-only snapshot of a fleet host (memory, load, GPU clocks, boot target, containers, disks)
description:
  - Takes, in one call per host, what the fleet's runbook records before and after every change and what
    drift detection compares with the desired state (docs/reference.md sections 6, 9 and 11).
  - C(memory) reads C(/proc/meminfo) (MemTotal, MemFree, MemAvailable, Cached, CmaTotal, CmaFree, and whether
    CmaFree exceeds CmaTotal, the Kexec HandOver tell) and the pressure stalls of C(/proc/pressure/memory)
    when the kernel has them.
  - C(load) reads C(/proc/loadavg) and the CPU count.
  - C(gpu) runs C(nvidia-smi --query-gpu) and C(nvidia-smi -q -d CLOCK) for the name, driver, current and
    maximum SM clock and the locked clock range of every GPU (null when no lock is in force).
  - C(boot) reads the default systemd target, the display manager behind C(display-manager.service) and
    whether it runs, and the loaded C(nvidia_drm) parameters (null where the module is not loaded).
  - C(containers) lists every container (C(docker ps -a) and C(docker inspect)) with name, image, state,
    labels, owner label and whether it is a serving container; C(serving) adds the serving containers'
    environment, image, image id and mounts.
  - C(disks) measures each named volume with statvfs (the nearest existing parent when the path does not
    exist yet); C(files) hashes the given paths (sha256, mode, link target, text content up to a size);
    C(units) reads C(systemctl is-enabled) and C(is-active) of the given units.
  - A section that cannot be read is null and says why under C(errors); the module itself fails only on
    bad options.
version_added: "0.1.0"
author: sparkfleet contributors (!UNKNOWN)
extends_documentation_fragment:
  - fleet_snapshot
attributes:
  check_mode:
    support: full
    description: The module only reads; check mode returns the same snapshot.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
notes:
  - Uses only the Python standard library on the host, plus the C(nvidia-smi), C(docker) and C(systemctl) commands.
seealso:
  - module: boot_log_info
"""

EXAMPLES = r"""
- name: Take a snapshot of every node before the change
  fleet_snapshot_info:
    serving_image: "{{ fleet_image }}"
    volumes:
      engram: "{{ fleet_engram_dir }}"
      archive: "{{ fleet_archive_dir }}"
  register: before

- name: Read only the GPU clocks and lock
  fleet_snapshot_info:
    gather: [gpu]
  register: clocks

- name: Hash the clock-lock unit and read its state
  fleet_snapshot_info:
    gather: [files, units]
    files: [/etc/systemd/system/nvidia-clock-lock.service]
    units: [nvidia-clock-lock.service]
  register: unit

- name: Stop when the kernel shows the CMA tell of Kexec HandOver
  ansible.builtin.assert:
    that: not before.snapshot.memory.cma_free_exceeds_total
    fail_msg: "{{ inventory_hostname }}: CmaFree > CmaTotal; boot with kho=off (docs/reference.md section 11)"
"""

RETURN = r"""
snapshot:
  description: The snapshot; only the sections asked for are present.
  returned: always
  type: dict
  contains:
    host:
      description: The host's name as it reports it.
      type: str
      sample: spark3
    taken_at:
      description: UTC time of the snapshot.
      type: str
      sample: "2026-11-29T10:01:02Z"
    sections:
      description: The sections taken.
      type: list
      elements: str
      sample: [memory, gpu]
    errors:
      description: Per section that could not be read, why.
      type: dict
      sample: {"gpu": "gpu: cannot run nvidia-smi: [Errno 2] No such file or directory"}
    memory:
      description: Memory in kB and pressure stalls (pressure null without /proc/pressure/memory).
      type: dict
      sample: {"mem_total_kb": 127587400, "mem_free_kb": 121100000, "mem_available_kb": 122900000,
               "cached_kb": 1702400, "cma_total_kb": 0, "cma_free_kb": 0, "cma_free_exceeds_total": false,
               "pressure": {"some": {"avg10": 0.0, "avg60": 0.0, "avg300": 0.0, "total": 0},
                            "full": {"avg10": 0.0, "avg60": 0.0, "avg300": 0.0, "total": 0}}}
    load:
      description: Load averages, runnable and total processes, CPU count.
      type: dict
      sample: {"load1": 0.5, "load5": 0.4, "load15": 0.3, "runnable": 1, "processes": 412, "cpus": 20}
    gpu:
      description: The first GPU's clocks and lock, the driver, and every GPU in C(gpus).
      type: dict
      sample: {"count": 1, "name": "NVIDIA GB10", "driver": "580.159.03", "sm_mhz": 208, "max_sm_mhz": 3003,
               "locked": {"min_mhz": 0, "max_mhz": 2200}, "gpus": [{"index": 0, "bus_id": "00000000:01:00.0"}]}
    boot:
      description: Default target, display manager and loaded nvidia_drm parameters.
      type: dict
      sample: {"default_target": "graphical.target", "default_target_source": "link",
               "display_manager": {"unit": "gdm.service", "active": "active"}, "nvidia_drm": null}
    containers:
      description: Every container, sorted by name.
      type: list
      elements: dict
      sample: [{"name": "grafana", "id": "0123456789ab", "image": "grafana/grafana:11.2.0",
                "image_id": "sha256:...", "state": "paused", "labels": {"owner": "zurih"}, "owner": "zurih",
                "restart_policy": "unless-stopped", "serving": false}]
    serving:
      description: The fleet image's id and the serving containers with their env, image and mounts.
      type: dict
      sample: {"image": "dsv41-3x-spark:local", "image_id": "sha256:...",
               "containers": [{"name": "dsv41-worker", "image": "dsv41-3x-spark:local", "state": "running",
                               "env": {"NODE_RANK": "2", "TP_SIZE": "3"}, "mounts": []}]}
    disks:
      description: Per named volume, statvfs of the path (or its nearest existing parent).
      type: dict
      sample: {"engram": {"path": "/home/zurih/dsv41-3x-spark/engram", "exists": true, "measured_path":
               "/home/zurih/dsv41-3x-spark/engram", "device": 45, "total_bytes": 268435456,
               "free_bytes": 268369920, "available_bytes": 268369920, "used_percent": 0.0}}
    files:
      description: Per path, whether it exists, its type, mode, size, sha256, link target and small text content.
      type: dict
      sample: {"/etc/modprobe.d/zz-nvidia-drm-override.conf": {"exists": true, "type": "file", "mode": "0644",
               "size": 52, "sha256": "9f2c...", "content": "# Ansible managed\noptions nvidia-drm modeset=1 fbdev=0\n"}}
    units:
      description: Per unit, the words C(systemctl is-enabled) and C(is-active) print.
      type: dict
      sample: {"nvidia-clock-lock.service": {"enabled": "enabled", "active": "active"}}
"""

from ansible.module_utils.fleet_snapshot import run_module


def main() -> None:
    run_module("fleet_snapshot_info")


if __name__ == "__main__":
    main()
