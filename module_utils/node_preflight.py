# -*- coding: utf-8 -*-
# Over 600 lines on purpose: one function per check of docs/reference.md section 11 and the verdict; the parsers
# are in node_preflight_parsers.py.
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read-only preflight of one GB10 node (docs/reference.md section 11): the host problems that cost a boot.

Each check returns a verdict a tired operator can act on: its status (pass, warn, fail), one line that
says what was found (with the numbers), and the fix. The node's overall verdict is the worst of:

    start               every check passed (warnings may remain)
    fix first           a setting is wrong (kernel, driver, fabric, GID, swap, clocks, ...): fix, re-run
    reboot first        memory is too fragmented for the engine to start: reboot, then start
    power cycle needed  the kernel log shows a wedge (NVRM NV_ERR_NO_MEMORY / Xid, mlx5 or AER fatal):
                        the node is taken out; nothing restarts it automatically

Plain Python (standard library only): hosts have a bare Debian python3. Every path is in ``Paths`` so
tests point it at fixtures; every command goes through an injected ``run(argv) -> (rc, out, err)``.
Commands run concurrently (they are independent reads), so one call stays well under a second.

The parsers (text of /proc, /sys, nvidia-smi, dpkg-query, ip to data) live in module_utils/node_preflight_parsers.py;
this file holds the node's reads and the eleven checks. It is longer than 600 lines because the checks share one
Node and one verdict order, and read best side by side.
"""
from __future__ import annotations

import fnmatch
import hashlib
import ipaddress
import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional

from ansible.module_utils.node_preflight_parsers import (  # noqa: F401 (the parsers, re-exported)
    _read, parse_meminfo, parse_cmdline, parse_buddyinfo, parse_vmstat, parse_swaps, parse_nvidia_version,
    parse_clock_lock, scan_kernel_log, parse_dpkg_query, parse_ip_addr, gid_to_ipv4, read_gid_table, read_hcas,
    MAX_WEDGE_LINES, WEDGE_SIGNATURES, ZERO_GID)

Runner = Callable[[list], tuple]

CHECKS = ("kernel", "kho", "driver", "fragmentation", "fabric", "gid", "swap", "oom_daemons", "shm", "clocks",
          "kernel_log")
VERDICTS = ("start", "fix first", "reboot first", "power cycle needed")   # in increasing severity
GIB = 1024 ** 3
KIB = 1024
DRIVER_RE = re.compile(r"^\d+(\.\d+)+-(open|proprietary)$")
KHO_OFF_VALUES = ("off", "0", "n", "no", "false")
DEFAULT_OOM_DAEMONS = ("systemd-oomd", "earlyoom", "nohang", "oomd")
DEFAULT_WEDGE_XIDS = (79, 119, 120, 154)


class PreflightError(Exception):
    """Bad input (an unknown HCA, a malformed allow-list entry): the module fails with this message."""


@dataclass(frozen=True)
class Paths:
    """Where the node's state is read from (tests replace them with fixtures)."""
    cmdline: str = "/proc/cmdline"
    osrelease: str = "/proc/sys/kernel/osrelease"
    buddyinfo: str = "/proc/buddyinfo"
    meminfo: str = "/proc/meminfo"
    vmstat: str = "/proc/vmstat"
    swaps: str = "/proc/swaps"
    nvidia_version: str = "/proc/driver/nvidia/version"
    infiniband: str = "/sys/class/infiniband"
    bios_version: str = "/sys/class/dmi/id/bios_version"
    shm: str = "/dev/shm"
    proc: str = "/proc"


@dataclass(frozen=True)
class Request:
    """What the node must look like (the module's options)."""
    allowed_kernels: tuple = ()
    kho_kernels: tuple = ()
    allowed_drivers: tuple = ()
    min_order: int = 10
    min_high_order_gib: float = 16.0
    min_memfree_ratio: float = 0.8
    fabric_address: str = ""
    fabric_interfaces: tuple = ()
    fabric_mtu: int = 9000
    hcas: tuple = ()
    gid_index_pin: Optional[int] = None
    max_swap_kb: int = 0
    oom_daemons: tuple = DEFAULT_OOM_DAEMONS
    min_shm_gib: float = 32.0
    clock_lock: str = "locked"          # locked, unlocked or any
    clock_lock_min_mhz: int = 0
    clock_lock_max_mhz: int = 2200
    wedge_xids: tuple = DEFAULT_WEDGE_XIDS
    previous_boot_wedge: str = "warn"   # warn or fail
    image: str = ""
    page_size: int = 0                  # 0: this host's page size
    checks: tuple = CHECKS
    advisory: tuple = ()                # checks whose failure is reported as a warning and does not block
    packages: tuple = ()                # dpkg name globs whose installed versions and holds are reported


@dataclass
class Check:
    name: str
    status: str = "pass"                # pass, warn, fail
    summary: str = ""
    fix: str = ""
    verdict: str = "start"              # what this check alone says about starting the engine
    facts: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "verdict": self.verdict, "summary": self.summary,
                "fix": self.fix, "facts": self.facts}


def default_runner(argv: list) -> tuple:
    env = dict(os.environ, LC_ALL="C", LANG="C", SYSTEMD_PAGER="", SYSTEMD_COLORS="0")
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                          env=env, timeout=60)
    return proc.returncode, proc.stdout, proc.stderr


def _gib(value_bytes: float) -> str:
    return f"{value_bytes / GIB:.1f} GiB"


def _matches(value: str, patterns: tuple) -> bool:
    return any(fnmatch.fnmatchcase(value, p) for p in patterns)


# ------------------------------------------------------------------ the checks

class Node:
    """One node's raw state, read once; each check looks at it."""

    def __init__(self, request: Request, paths: Paths, run: Runner):
        self.req, self.paths, self.run = request, paths, run
        self.errors: dict = {}
        self.commands: dict = {}

    def read(self, key: str, path: str) -> Optional[str]:
        try:
            return _read(path)
        except OSError as exc:
            self.errors[key] = f"cannot read {path}: {exc.strerror or exc}"
            return None

    def gather(self) -> None:
        wanted = set(self.req.checks)
        commands = {}
        if wanted & {"fabric", "gid"}:
            commands["ip"] = ["ip", "-j", "addr", "show"]
        if wanted & {"clocks", "driver"}:
            commands["nvidia_smi"] = ["nvidia-smi", "-q", "-d", "CLOCK"]
        if "kernel_log" in wanted:
            commands["journal_0"] = ["journalctl", "-k", "-b", "0", "--no-pager", "-q", "-o", "short-iso"]
            commands["journal_1"] = ["journalctl", "-k", "-b", "-1", "--no-pager", "-q", "-o", "short-iso"]
        if self.req.image:
            commands["image"] = ["docker", "image", "inspect", self.req.image]
        if self.req.packages:
            commands["packages"] = ["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${db:Status-Abbrev}\n",
                                    *self.req.packages]

        def call(argv):
            try:
                return self.run(argv)
            except (OSError, subprocess.SubprocessError) as exc:
                return None, "", f"cannot run {argv[0]}: {exc}"

        with ThreadPoolExecutor(max_workers=max(1, len(commands))) as pool:
            futures = {key: pool.submit(call, argv) for key, argv in commands.items()}
            self.release = (self.read("osrelease", self.paths.osrelease) or "").strip() or None
            self.cmdline_text = (self.read("cmdline", self.paths.cmdline) or "").strip()
            self.cmdline = parse_cmdline(self.cmdline_text)
            self.meminfo = parse_meminfo(self.read("meminfo", self.paths.meminfo) or "")
            self.buddy = parse_buddyinfo(self.read("buddyinfo", self.paths.buddyinfo) or "")
            vmstat = self.read("vmstat", self.paths.vmstat)
            self.vmstat = parse_vmstat(vmstat or "", ("compact_stall", "compact_fail", "compact_success"))
            swaps = self.read("swaps", self.paths.swaps)
            self.swaps = parse_swaps(swaps) if swaps is not None else None
            nv = None
            if os.path.exists(self.paths.nvidia_version):
                nv = self.read("nvidia_version", self.paths.nvidia_version)
            self.nvidia = parse_nvidia_version(nv) if nv else None
            self.hcas = read_hcas(self.paths.infiniband)   # the gid check and the firmware fact
            try:
                self.bios = _read(self.paths.bios_version).strip() or None
            except OSError:
                self.bios = None
            self.page_size = self.req.page_size or os.sysconf("SC_PAGE_SIZE")
            self.processes = self._process_names() if "oom_daemons" in wanted else {}
            for key, future in futures.items():
                self.commands[key] = future.result()

    def _process_names(self) -> dict:
        """Running OOM daemons of this host: processes of this mount namespace (an OOM daemon runs in the
        host's own namespace; a container's processes, in theirs, do not count)."""
        wanted = set(self.req.oom_daemons)
        found = {}
        try:
            pids = [p for p in os.listdir(self.paths.proc) if p.isdigit()]
            own_ns = os.readlink(os.path.join(self.paths.proc, "self", "ns", "mnt"))
        except OSError:
            return found
        for pid in pids:
            try:
                name = _read(os.path.join(self.paths.proc, pid, "comm")).strip()
                if name in wanted and os.readlink(os.path.join(self.paths.proc, pid, "ns", "mnt")) == own_ns:
                    found.setdefault(name, []).append(int(pid))
            except OSError:
                continue
        return found

    def command(self, key: str) -> tuple:
        return self.commands.get(key) or (None, "", "not run")


def check_kernel(node: Node) -> Check:
    c = Check("kernel", facts={"release": node.release})
    allowed = node.req.allowed_kernels
    if node.release is None:
        c.status, c.verdict = "fail", "fix first"
        c.summary = f"cannot read the kernel release ({node.errors.get('osrelease')})"
        c.fix = "check /proc/sys/kernel/osrelease on this node"
    elif _matches(node.release, allowed):
        c.summary = f"kernel {node.release} is allowed"
    else:
        c.status, c.verdict = "fail", "fix first"
        c.summary = f"kernel {node.release} is not in preflight_allowed_kernels ({', '.join(allowed)})"
        c.fix = (f"boot an allowed kernel (set the GRUB default to one of {', '.join(allowed)} and reboot), or "
                 f"qualify {node.release} and add it to preflight_allowed_kernels; keep kernel packages held "
                 "(roles/package_holds)")
    return c


def check_kho(node: Node) -> Check:
    release = node.release or ""
    value = node.cmdline.get("kho", "") if "kho" in node.cmdline else None
    kho_off = value is not None and (value or "").lower() in KHO_OFF_VALUES
    needs = bool(release) and _matches(release, node.req.kho_kernels)
    cma_total, cma_free = node.meminfo.get("CmaTotal"), node.meminfo.get("CmaFree")
    cma_bad = cma_total is not None and cma_free is not None and cma_free > cma_total
    c = Check("kho", facts={"needs_kho_off": needs, "kho": value, "kho_off": kho_off, "cma_total_kb": cma_total,
                            "cma_free_kb": cma_free, "cmdline": node.cmdline_text})
    problems = []
    if needs and not kho_off:
        problems.append(f"kernel {release} enables Kexec HandOver but the kernel command line has "
                        f"{'kho=' + value if value is not None else 'no kho=off'}")
    if cma_bad:
        problems.append(f"CmaFree ({cma_free} kB) is above CmaTotal ({cma_total} kB): KHO scratch CMA is active, "
                        "RDMA registration will fail at NCCL init")
    if "meminfo" in node.errors:
        problems.append(node.errors["meminfo"])
    if problems:
        c.status, c.verdict = "fail", "fix first"
        c.summary = "; ".join(problems)
        c.fix = ("add kho=off to GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub, run update-grub and reboot "
                 "(a reboot without it does not help)")
    elif needs:
        c.summary = f"kho=off is on the command line of {release}; CmaFree {cma_free} kB <= CmaTotal {cma_total} kB"
    else:
        c.summary = f"{release or 'this kernel'} does not need kho=off; CmaFree {cma_free} kB <= CmaTotal {cma_total} kB"
    return c


def check_driver(node: Node) -> Check:
    version, flavour, source = None, None, None
    if node.nvidia and node.nvidia["version"]:
        version, flavour, source = node.nvidia["version"], node.nvidia["flavour"], node.paths.nvidia_version
    else:
        rc, out, err = node.command("nvidia_smi")
        if rc == 0:
            version = parse_clock_lock(out)["driver"]
            source = "nvidia-smi"
    c = Check("driver", facts={"version": version, "flavour": flavour, "source": source})
    allowed = node.req.allowed_drivers
    found = f"{version}-{flavour or 'unknown'}" if version else None
    c.facts["driver"] = found
    if version is None:
        c.status, c.verdict = "fail", "fix first"
        c.summary = f"no NVIDIA driver is loaded ({node.paths.nvidia_version} is missing and nvidia-smi did not answer)"
        c.fix = f"install and load one of {', '.join(allowed)} (the open kernel module), then reboot"
    elif found in allowed:
        c.summary = f"driver {version} ({flavour} kernel module) is allowed"
    else:
        c.status, c.verdict = "fail", "fix first"
        what = (f"driver {version} ({flavour} kernel module)" if flavour
                else f"driver {version} (flavour unknown: {node.paths.nvidia_version} unreadable)")
        c.summary = f"{what} is not in preflight_allowed_drivers ({', '.join(allowed)})"
        c.fix = (f"install one of {', '.join(allowed)} (nvidia-driver-<major>-open for the open module) and reboot, "
                 "or qualify this one and add it to preflight_allowed_drivers; keep driver packages held")
    return c


def check_fragmentation(node: Node) -> Check:
    req = node.req
    page = node.page_size
    zones = node.buddy
    c = Check("fragmentation")
    if not zones:
        c.status, c.verdict = "fail", "fix first"
        c.summary = f"cannot read the buddy allocator ({node.errors.get('buddyinfo', 'no zones in /proc/buddyinfo')})"
        c.fix = "check /proc/buddyinfo on this node"
        return c
    max_order = min(len(z["free"]) for z in zones) - 1
    if req.min_order > max_order:
        raise PreflightError(f"preflight_min_order={req.min_order} but /proc/buddyinfo on this node has orders "
                             f"0..{max_order}: use at most {max_order}")
    high = sum(count * (1 << order) * page for z in zones for order, count in enumerate(z["free"])
               if order >= req.min_order)
    total_free = sum(count * (1 << order) * page for z in zones for order, count in enumerate(z["free"]))
    blocks = sum(count for z in zones for order, count in enumerate(z["free"]) if order >= req.min_order)
    mem_free = node.meminfo.get("MemFree", 0) * KIB
    mem_available = node.meminfo.get("MemAvailable", 0) * KIB
    block_bytes = (1 << req.min_order) * page
    need = int(req.min_high_order_gib * GIB)
    c.facts = {"min_order": req.min_order, "block_bytes": block_bytes, "high_order_blocks": blocks,
               "high_order_free_bytes": high, "buddy_free_bytes": total_free, "required_bytes": need,
               "mem_free_bytes": mem_free, "mem_available_bytes": mem_available, "page_size": page,
               "compaction": node.vmstat,
               "zones": [{"node": z["node"], "zone": z["zone"], "free": z["free"]} for z in zones]}
    block = f"{block_bytes // (1024 * 1024)} MiB" if block_bytes >= 1024 * 1024 else f"{block_bytes // 1024} KiB"
    stalls = (f"; compaction stalls {node.vmstat.get('compact_stall')}, failures {node.vmstat.get('compact_fail')}"
              if node.vmstat else "")
    if high < need:
        c.status, c.verdict = "fail", "reboot first"
        c.facts["gate"] = "reboot first"
        c.summary = (f"reboot first: only {_gib(high)} free in blocks of order >= {req.min_order} ({block}+), "
                     f"{blocks} blocks, needs {_gib(need)}; MemFree {_gib(mem_free)}, MemAvailable "
                     f"{_gib(mem_available)}{stalls}")
        c.fix = ("reboot this node before starting the engine (the next start would fail with NV_ERR_NO_MEMORY "
                 "and can livelock the node); do not start it now")
        return c
    c.facts["gate"] = "start"
    c.summary = (f"start: {_gib(high)} free in {blocks} blocks of order >= {req.min_order} ({block}+); "
                 f"MemFree {_gib(mem_free)}, MemAvailable {_gib(mem_available)}{stalls}")
    if mem_available and mem_free < req.min_memfree_ratio * mem_available:
        c.status = "warn"
        c.summary += (f"; page cache holds {_gib(mem_available - mem_free)}: the GPU sees MemFree, not "
                      "MemAvailable")
        c.fix = "drop the page cache before starting (sync; echo 3 > /proc/sys/vm/drop_caches)"
    return c


def _interfaces(node: Node) -> Optional[dict]:
    rc, out, err = node.command("ip")
    if rc != 0:
        node.errors["ip"] = f"`ip -j addr show` failed: {(err or out).strip()[:200]}"
        return None
    try:
        return parse_ip_addr(out)
    except (ValueError, KeyError, TypeError) as exc:
        node.errors["ip"] = f"cannot parse `ip -j addr show`: {exc}"
        return None


def check_fabric(node: Node) -> Check:
    req = node.req
    c = Check("fabric")
    links = _interfaces(node)
    if links is None:
        c.status, c.verdict = "fail", "fix first"
        c.summary, c.fix = node.errors["ip"], "check iproute2 on this node"
        return c
    holders = sorted(name for name, link in links.items() if req.fabric_address in link["ipv4"])
    rows, problems, fixes = [], [], []
    for name in req.fabric_interfaces:
        link = links.get(name)
        if link is None:
            rows.append({"interface": name, "present": False})
            problems.append(f"fabric interface {name} does not exist (interfaces: {', '.join(sorted(links))})")
            fixes.append(f"fix fleet_fabric_interfaces or the netplan file that should create {name}")
            continue
        rows.append({"interface": name, "present": True, "up": link["up"], "mtu": link["mtu"],
                     "operstate": link["operstate"], "ipv4": link["ipv4"]})
        if not link["up"]:
            problems.append(f"{name} is down (operstate {link['operstate']})")
            fixes.append(f"bring {name} up (ip link set dev {name} up) and check the cable and switch port")
        if link["mtu"] != req.fabric_mtu:
            problems.append(f"{name} has MTU {link['mtu']}, not {req.fabric_mtu} (RDMA retries, slow prefill)")
            fixes.append(f"ip link set dev {name} mtu {req.fabric_mtu} now, and keep mtu: {req.fabric_mtu} for "
                         f"{name} in netplan (netplan owns the MTU; nmcli edits vanish), then check the peers too")
    c.facts = {"address": req.fabric_address, "held_by": holders, "interfaces": rows, "mtu": req.fabric_mtu}
    if not holders:
        problems.insert(0, f"no interface holds the fabric address {req.fabric_address}")
        fixes.insert(0, f"give {' or '.join(req.fabric_interfaces)} the address {req.fabric_address} in netplan "
                        "(addresses:), or correct fleet_fabric_address in the inventory")
    elif not set(holders) & set(req.fabric_interfaces):
        problems.insert(0, f"the fabric address {req.fabric_address} is on {', '.join(holders)}, not on a fabric "
                           f"interface ({', '.join(req.fabric_interfaces)})")
        fixes.insert(0, "move the address to the fabric interface in netplan, or correct fleet_fabric_interfaces")
    if problems:
        c.status, c.verdict = "fail", "fix first"
        c.summary, c.fix = "; ".join(problems), "; ".join(fixes)
    else:
        c.summary = (f"{', '.join(req.fabric_interfaces)} up at MTU {req.fabric_mtu}, "
                     f"{req.fabric_address} on {', '.join(holders)}")
    return c


def resolve_gid_indices(hcas: dict, names: tuple, address: str, interfaces: tuple) -> tuple:
    """(resolved {hca: {"port", "index", "gid", "ndev"}}, candidates, unknown names).

    Candidates are the named HCAs, or every HCA whose port maps to a fabric interface; per candidate the
    RoCE v2 GID whose address is ::ffff:<address>, lowest index first (what NCCL_IB_GID_INDEX must be).
    """
    unknown = [n for n in names if n not in hcas]
    if names:
        candidates = [n for n in names if n in hcas]
    else:
        candidates = [n for n, h in hcas.items() if set(h["netdevs"]) & set(interfaces)]
    resolved = {}
    for name in candidates:
        for port, rows in sorted(hcas[name]["ports"].items(), key=lambda kv: int(kv[0])):
            hit = next((r for r in rows if r["type"] == "RoCE v2" and r["ipv4"] == address), None)
            if hit:
                resolved[name] = {"port": int(port), "index": hit["index"], "gid": hit["gid"], "ndev": hit["ndev"]}
                break
    return resolved, candidates, unknown


def check_gid(node: Node) -> Check:
    req = node.req
    resolved, candidates, unknown = resolve_gid_indices(node.hcas, req.hcas, req.fabric_address,
                                                        req.fabric_interfaces)
    if unknown:
        raise PreflightError(
            f"unknown HCA {', '.join(unknown)}: {node.paths.infiniband} on this node has "
            f"{', '.join(sorted(node.hcas)) or 'no RDMA devices'}; correct preflight_hcas (or leave it empty to use "
            f"the HCAs of {', '.join(req.fabric_interfaces)})")
    c = Check("gid", facts={"hcas": resolved, "candidates": candidates, "address": req.fabric_address,
                            "pin": req.gid_index_pin})
    indices = sorted({r["index"] for r in resolved.values()})
    c.facts["gid_index"] = indices[0] if len(indices) == 1 else (indices or None)
    if not candidates:
        c.status, c.verdict = "fail", "fix first"
        c.summary = (f"no RDMA device maps to {', '.join(req.fabric_interfaces)} "
                     f"({node.paths.infiniband}: {', '.join(sorted(node.hcas)) or 'empty'})")
        c.fix = "load the mlx5 RDMA drivers (mlx5_ib) or name the HCAs in preflight_hcas"
        return c
    missing = [n for n in candidates if n not in resolved] if req.hcas else ([] if resolved else candidates)
    if missing:
        tables = "; ".join(
            f"{n}: " + ", ".join(f"{r['index']}={r['type']} {r['ipv4'] or r['gid']}"
                                 for rows in node.hcas[n]["ports"].values() for r in rows) for n in missing)
        c.status, c.verdict = "fail", "fix first"
        c.summary = f"no RoCE v2 GID for ::ffff:{req.fabric_address} on {', '.join(missing)} ({tables or 'no GIDs'})"
        c.fix = (f"give the HCA's interface the address {req.fabric_address} (netplan) and check RoCE v2 is enabled; "
                 "GIDs follow the interface's addresses")
        return c
    described = ", ".join(f"{n} port {r['port']} index {r['index']} ({r['ndev']})" for n, r in sorted(resolved.items()))
    if req.gid_index_pin is not None and any(r["index"] != req.gid_index_pin for r in resolved.values()):
        c.status, c.verdict = "fail", "fix first"
        c.summary = (f"the pinned GID index {req.gid_index_pin} is not the RoCE v2 GID of {req.fabric_address} here: "
                     f"{described}")
        c.fix = ("drop the pin (preflight_gid_index_pin / NCCL_IB_GID_INDEX): the engine must use the index "
                 "resolved on each node at every start; GID indices move after reboots and netplan re-applies")
        return c
    c.summary = f"RoCE v2 GID of {req.fabric_address}: {described}"
    return c


def check_swap(node: Node) -> Check:
    c = Check("swap")
    if node.swaps is None:
        c.status, c.verdict = "fail", "fix first"
        c.summary, c.fix = node.errors.get("swaps", "cannot read /proc/swaps"), "check /proc/swaps"
        return c
    total = sum(s["size_kb"] for s in node.swaps)
    c.facts = {"total_kb": total, "devices": node.swaps}
    if total > node.req.max_swap_kb:
        names = ", ".join(f"{s['name']} ({s['size_kb'] // 1024} MiB {s['type']})" for s in node.swaps)
        c.status, c.verdict = "fail", "fix first"
        c.summary = f"swap is on: {names}; allowed {node.req.max_swap_kb} kB"
        c.fix = ("swapoff -a, then remove the swap lines from /etc/fstab and disable zram swap "
                 "(systemctl disable --now nvzramconfig zramswap) so it stays off after a reboot")
    else:
        c.summary = "swap is off" if not total else f"swap {total} kB (allowed {node.req.max_swap_kb} kB)"
    return c


def check_oom_daemons(node: Node) -> Check:
    c = Check("oom_daemons", facts={"running": node.processes})
    if node.processes:
        names = ", ".join(f"{n} (pid {', '.join(str(p) for p in sorted(pids))})"
                          for n, pids in sorted(node.processes.items()))
        c.status, c.verdict = "fail", "fix first"
        c.summary = f"an OOM daemon runs: {names}; it kills the engine under unified-memory pressure"
        units = " ".join(f"{n}.service" for n in sorted(node.processes))
        c.fix = f"systemctl disable --now {units} (and systemd-oomd.socket where present)"
    else:
        c.summary = f"no OOM daemon runs ({', '.join(node.req.oom_daemons)})"
    return c


def check_shm(node: Node) -> Check:
    c = Check("shm")
    try:
        st = os.statvfs(node.paths.shm)
    except OSError as exc:
        c.status, c.verdict = "fail", "fix first"
        c.summary = f"cannot measure {node.paths.shm}: {exc.strerror or exc}"
        c.fix = f"mount a tmpfs at {node.paths.shm}"
        return c
    size = st.f_frsize * st.f_blocks
    need = int(node.req.min_shm_gib * GIB)
    c.facts = {"size_bytes": size, "free_bytes": st.f_frsize * st.f_bavail, "required_bytes": need}
    if size < need:
        c.status, c.verdict = "fail", "fix first"
        c.summary = f"{node.paths.shm} is {_gib(size)}, needs {_gib(need)} (the engine runs with --ipc host)"
        c.fix = (f"mount -o remount,size={int(node.req.min_shm_gib)}G {node.paths.shm} and set the size on the "
                 f"{node.paths.shm} line of /etc/fstab")
    else:
        c.summary = f"{node.paths.shm} is {_gib(size)} (needs {_gib(need)})"
    return c


def check_clocks(node: Node) -> Check:
    req = node.req
    rc, out, err = node.command("nvidia_smi")
    c = Check("clocks")
    if rc != 0:
        c.status, c.verdict = "fail", "fix first"
        c.summary = f"nvidia-smi -q -d CLOCK failed: {(err or out).strip()[:200] or rc}"
        c.fix = "check the driver (nvidia-smi must answer)"
        return c
    parsed = parse_clock_lock(out)
    locked = parsed["locked"]
    want = [req.clock_lock_min_mhz, req.clock_lock_max_mhz]
    c.facts = {"locked": locked, "wanted": req.clock_lock, "wanted_range": want if req.clock_lock == "locked" else None}
    shown = f"{locked[0]}-{locked[1]} MHz" if locked else "no lock"
    if req.clock_lock == "locked" and locked != want:
        c.status, c.verdict = "fail", "fix first"
        c.summary = (f"the SM clock lock is {shown}, wants {want[0]}-{want[1]} MHz" if locked else
                     f"no SM clock lock is in force, wants {want[0]}-{want[1]} MHz (lost after a power cycle?)")
        c.fix = ("systemctl restart nvidia-clock-lock.service, and keep it enabled (playbooks/site.yml --tags "
                 "clock_lock converges it)")
    elif req.clock_lock == "unlocked" and locked:
        c.status, c.verdict = "fail", "fix first"
        c.summary = f"SM clocks are locked at {shown}, but this run wants them unlocked"
        c.fix = "nvidia-smi -rgc (site.yml with clock_lock_state=unlocked converges it)"
    else:
        c.summary = f"SM clock lock {shown}" + (" as wanted" if req.clock_lock != "any" else "")
    return c


def check_kernel_log(node: Node) -> Check:
    req = node.req
    c = Check("kernel_log")
    boots = {}
    for boot, key in (("0", "journal_0"), ("-1", "journal_1")):
        rc, out, err = node.command(key)
        if rc == 0:
            boots[boot] = {"read": True, "hits": scan_kernel_log(out, req.wedge_xids), "lines": out.count("\n")}
        else:
            boots[boot] = {"read": False, "error": (err or out).strip()[:300] or f"rc={rc}", "hits": []}
    c.facts = {"boots": boots}
    current, previous = boots["0"]["hits"], boots["-1"]["hits"]
    if current:
        kinds = sorted({h["signature"] for h in current})
        c.status, c.verdict = "fail", "power cycle needed"
        c.summary = f"this boot's kernel log shows a wedge ({', '.join(kinds)}): {current[0]['line']}"
        c.fix = ("keep the evidence (journalctl -k -b 0 > kernel-$(hostname).log), take the node out of service and "
                 "power cycle it (a reboot is not enough); nothing restarts it automatically")
        return c
    if not boots["0"]["read"]:
        c.status, c.verdict = "fail", "fix first"
        c.summary = f"cannot read this boot's kernel log: {boots['0']['error']}"
        c.fix = "check journalctl -k -b 0 on this node"
        return c
    if previous:
        kinds = sorted({h["signature"] for h in previous})
        c.summary = (f"the previous boot wedged ({', '.join(kinds)}): {previous[0]['line']}; this boot is clean")
        c.fix = "keep the previous boot's journal (journalctl -k -b -1 > kernel-prev-$(hostname).log)"
        if req.previous_boot_wedge == "fail":
            c.status, c.verdict = "fail", "power cycle needed"
            c.fix += "; power cycle the node, then re-run with preflight_previous_boot_wedge=warn"
        else:
            c.status = "warn"
        return c
    extra = "" if boots["-1"]["read"] else " (no previous boot in the journal)"
    c.summary = f"no wedge signature in this boot's kernel log or the previous one's{extra}"
    return c


CHECK_FUNCTIONS = {
    "kernel": check_kernel, "kho": check_kho, "driver": check_driver, "fragmentation": check_fragmentation,
    "fabric": check_fabric, "gid": check_gid, "swap": check_swap, "oom_daemons": check_oom_daemons,
    "shm": check_shm, "clocks": check_clocks, "kernel_log": check_kernel_log,
}


def validate_request(req: Request) -> None:
    """Bad input fails before anything is read: empty allow-lists, malformed entries, a bad address."""
    problems = []
    wanted = set(req.checks)
    if "kernel" in wanted and not req.allowed_kernels:
        problems.append("allowed_kernels (preflight_allowed_kernels) is empty: list the kernel releases this fleet "
                        "may run (uname -r), e.g. 7.0.0-1019-nvidia")
    if "driver" in wanted and not req.allowed_drivers:
        problems.append("allowed_drivers (preflight_allowed_drivers) is empty: list VERSION-FLAVOUR entries, "
                        "e.g. 580.159.03-open")
    bad = [d for d in req.allowed_drivers if not DRIVER_RE.match(d)]
    if bad:
        problems.append(f"allowed_drivers entries must read VERSION-open or VERSION-proprietary, not {', '.join(bad)}")
    if wanted & {"fabric", "gid"}:
        try:
            ipaddress.IPv4Address(req.fabric_address)
        except ValueError:
            problems.append(f"fabric_address (fleet_fabric_address) must be an IPv4 address, not {req.fabric_address!r}")
        if not req.fabric_interfaces:
            problems.append("fabric_interfaces (fleet_fabric_interfaces) is empty: name the interfaces that carry "
                            "the fabric, e.g. enp1s0f0np0")
    if req.min_order < 0:
        problems.append(f"min_order must be 0 or more, not {req.min_order}")
    if req.clock_lock not in ("locked", "unlocked", "any"):
        problems.append(f"clock_lock must be locked, unlocked or any, not {req.clock_lock!r}")
    if req.previous_boot_wedge not in ("warn", "fail"):
        problems.append(f"previous_boot_wedge must be warn or fail, not {req.previous_boot_wedge!r}")
    unknown = [c for c in tuple(req.checks) + tuple(req.advisory) if c not in CHECK_FUNCTIONS]
    if unknown:
        problems.append(f"unknown checks {', '.join(unknown)} (known: {', '.join(CHECKS)})")
    if problems:
        raise PreflightError("; ".join(problems))


def parity_facts(node: Node, checks: dict) -> dict:
    """The values the fleet parity table compares across ranks (strings, so equal means equal)."""
    def fact(name, key, default=None):
        return checks[name].facts.get(key, default) if name in checks else default

    driver = fact("driver", "driver")
    fw = [f"{name} {h['fw_ver']}" for name, h in sorted(node.hcas.items()) if h["fw_ver"]]
    firmware = "; ".join(([f"bios {node.bios}"] if node.bios else []) + fw) or None
    swap_kb = fact("swap", "total_kb")
    locked = fact("clocks", "locked")
    gids = fact("gid", "hcas") or {}
    nccl, image_id, image_key = None, None, None
    rc, out, err = node.command("image")
    if rc == 0:
        try:
            image = json.loads(out)[0]
            env = dict(e.split("=", 1) for e in (image.get("Config") or {}).get("Env") or [] if "=" in e)
            nccl = env.get("NCCL_VERSION") or (image.get("Config") or {}).get("Labels", {}).get("nccl.version")
            image_id = image.get("Id")
            image_key = image_identity(image)
        except (ValueError, IndexError, AttributeError, TypeError):
            pass
    return {
        "kernel": node.release,
        "driver": driver,
        "firmware": firmware,
        "nccl": nccl,
        "image": image_key,
        "image_id": image_id[:19] if image_id else None,
        "swap": None if swap_kb is None else ("off" if swap_kb == 0 else f"{swap_kb // 1024} MiB"),
        "clocks": None if "clocks" not in checks else (f"{locked[0]}-{locked[1]} MHz" if locked else "unlocked"),
        "fragmentation": fact("fragmentation", "gate"),
        "gid_index": ", ".join(f"{n}:{r['index']}" for n, r in sorted(gids.items())) or None,
        "kho": None if "kho" not in checks else ("off" if fact("kho", "kho_off") else "on"),
    }


# What an image runs, as `docker image inspect` shows it under Config: equal for one recipe built on every node.
IMAGE_CONFIG_KEYS = ("Env", "Entrypoint", "Cmd", "WorkingDir", "User", "Labels", "ExposedPorts", "Volumes")


def image_identity(image: dict) -> str | None:
    """The engine image as the parity table compares it across ranks: a digest of what it runs (Config's env,
    entrypoint, command, working dir, user, labels, ports, volumes), its base layer and its number of layers.
    Not the image id: every node `docker build`s the recipe itself, and the id (like each COPY layer, whose folders
    carry the build time) differs between nodes for the same recipe. Files copied into the image are checked where
    they matter (the adapter bundle's manifest, sha256 per file)."""
    if not image.get("Id"):
        return None
    config = image.get("Config") or {}
    layers = (image.get("RootFS") or {}).get("Layers") or []
    wanted = {key: config.get(key) for key in IMAGE_CONFIG_KEYS}
    wanted["Env"] = sorted(wanted["Env"] or [])
    wanted["base_layer"] = layers[0] if layers else None
    wanted["layers"] = len(layers)
    digest = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()
    return f"config:{digest[:12]}"


def preflight(request: Request, paths: Paths = Paths(), run: Runner = default_runner) -> dict:
    """Read the node once, run every requested check, return the verdicts (raises PreflightError on bad input)."""
    validate_request(request)
    node = Node(request, paths, run)
    node.gather()
    checks = {}
    for name in CHECKS:
        if name in request.checks:
            checks[name] = CHECK_FUNCTIONS[name](node)
    ordered = [checks[n] for n in CHECKS if n in checks]
    for c in ordered:
        if c.name in request.advisory and c.status == "fail":
            c.status = "warn"
            c.facts["advisory_verdict"] = c.verdict
            c.verdict = "start"
            c.summary = "advisory (does not stop this run): " + c.summary
    failed = [c.name for c in ordered if c.status == "fail"]
    warned = [c.name for c in ordered if c.status == "warn"]
    verdict = max((c.verdict for c in ordered if c.status == "fail"), key=VERDICTS.index, default="start")
    lines = [f"{c.name}: {c.status.upper()}: {c.summary}" + (f" FIX: {c.fix}" if c.fix and c.status != "pass" else "")
             for c in ordered]
    return {
        "verdict": verdict,
        "ok": not failed,
        "failed_checks": failed,
        "warned_checks": warned,
        "checks": [c.as_dict() for c in ordered],
        "lines": lines,
        "parity": parity_facts(node, checks),
        # dpkg-query exits 1 when one pattern matches nothing; the others are still listed.
        "packages": parse_dpkg_query(node.command("packages")[1]) if request.packages else {},
        "read_errors": node.errors,
    }
