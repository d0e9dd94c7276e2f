# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The parsers of the node preflight (module_utils/node_preflight.py holds the checks): pure functions from the
text of /proc, /sys, nvidia-smi, dpkg-query and ip to data, and the readers of the RDMA devices' sysfs tables.

Plain Python (standard library only): hosts have a bare Debian python3.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
from typing import Optional

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
# Kernel-log lines that mean the node is wedged or about to be (docs/reference.md section 11).
WEDGE_SIGNATURES = (
    ("nvrm_no_memory", re.compile(r"NVRM\b.*(NV_ERR_NO_MEMORY|\b0x0*51\b)")),
    ("nvrm_xid", re.compile(r"NVRM: Xid \([^)]*\): (\d+)\b")),
    ("mlx5_fatal", re.compile(r"mlx5_core\b.*(health recovery flow aborted|health compromised|recovery failed|"
                              r"unrecoverable|fatal error|FW_ERR)", re.I)),
    ("aer_fatal", re.compile(r"AER:.*(?<!Non-)\bFatal\b")),
)
MAX_WEDGE_LINES = 5


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def parse_meminfo(text: str) -> dict:
    values = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        parts = rest.split()
        if sep and parts and parts[0].isdigit():
            values[key.strip()] = int(parts[0])
    return values


def parse_cmdline(text: str) -> dict:
    """/proc/cmdline as {key: value} (value None for a bare flag); the last occurrence wins, like the kernel."""
    out = {}
    for token in text.split():
        if token == "--":
            break
        key, sep, value = token.partition("=")
        out[key] = value if sep else None
    return out


def parse_buddyinfo(text: str) -> list:
    """/proc/buddyinfo as [{"node": 0, "zone": "Normal", "free": [count at order 0, 1, ...]}]."""
    zones = []
    for line in text.splitlines():
        m = re.match(r"\s*Node\s+(\d+),\s*zone\s+(\S+)\s+(.*)$", line)
        if m:
            zones.append({"node": int(m.group(1)), "zone": m.group(2), "free": [int(x) for x in m.group(3).split()]})
    return zones


def parse_vmstat(text: str, keys: tuple) -> dict:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in keys:
            out[parts[0]] = int(parts[1])
    return out


def parse_swaps(text: str) -> list:
    """/proc/swaps as [{"name", "type", "size_kb", "used_kb", "priority"}] (the header line skipped)."""
    out = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 5:
            out.append({"name": parts[0], "type": parts[1], "size_kb": int(parts[2]), "used_kb": int(parts[3]),
                        "priority": int(parts[4])})
    return out


def parse_nvidia_version(text: str) -> dict:
    """/proc/driver/nvidia/version: the loaded kernel module's version and flavour (open or proprietary)."""
    first = text.splitlines()[0] if text.strip() else ""
    m = re.search(r"NVRM version:.*?\s(\d+(?:\.\d+)+)\s", first + " ")
    if not m:
        return {"version": None, "flavour": None, "line": first.strip()}
    flavour = "open" if "Open Kernel Module" in first else "proprietary"
    return {"version": m.group(1), "flavour": flavour, "line": first.strip()}


def _mhz(text: str) -> Optional[int]:
    """The leading number of a clock value (`1000 MHz` -> 1000; `N/A` -> None)."""
    number = re.match(r"\s*(\d+)", text or "")
    return int(number.group(1)) if number else None


def parse_clock_query(text: str) -> dict:
    """`nvidia-smi -q -d CLOCK`: the driver and, per GPU (in order), its Locked Clocks Min/Max. The one parser of
    this output (fleet_snapshot's gpu section and the preflight's clock check both use it)."""
    driver, gpus, current, section = None, [], None, None
    for raw in text.splitlines():
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        key, _, value = raw.strip().partition(":")
        key, value = key.strip(), value.strip()
        if indent == 0 and key == "Driver Version":
            driver = value
        elif indent == 0 and raw.startswith("GPU "):
            current = {"bus_id": raw[4:].strip(), "locked_min": None, "locked_max": None, "locked_seen": False}
            gpus.append(current)
            section = None
        elif current is not None and indent == 4 and not value:
            section = key
        elif current is not None and section == "Locked Clocks" and indent >= 8:
            current["locked_seen"] = True
            if key == "Min":
                current["locked_min"] = _mhz(value)
            elif key == "Max":
                current["locked_max"] = _mhz(value)
    return {"driver": driver, "gpus": gpus}


def parse_clock_lock(text: str) -> dict:
    """`nvidia-smi -q -d CLOCK`: driver and the first GPU's Locked Clocks range (None when not locked)."""
    parsed = parse_clock_query(text)
    first = parsed["gpus"][0] if parsed["gpus"] else {}
    lo, hi = first.get("locked_min"), first.get("locked_max")
    return {"driver": parsed["driver"], "gpu_seen": bool(parsed["gpus"]),
            "locked": [lo, hi] if lo is not None and hi is not None else None}


def scan_kernel_log(text: str, wedge_xids: tuple) -> list:
    """Wedge signatures in a kernel log: [{"signature", "line"}], at most MAX_WEDGE_LINES per signature."""
    hits, counts = [], {}
    for line in text.splitlines():
        if "NVRM" not in line and "mlx5" not in line and "AER" not in line:
            continue
        for name, pattern in WEDGE_SIGNATURES:
            m = pattern.search(line)
            if not m:
                continue
            if name == "nvrm_xid" and int(m.group(1)) not in wedge_xids:
                continue
            counts[name] = counts.get(name, 0) + 1
            if counts[name] <= MAX_WEDGE_LINES:
                hits.append({"signature": name, "line": line.strip()[:400]})
            break
    for name, count in counts.items():
        if count > MAX_WEDGE_LINES:
            hits.append({"signature": name, "line": f"... {count - MAX_WEDGE_LINES} more {name} lines"})
    return hits


def parse_dpkg_query(text: str) -> dict:
    """`dpkg-query -W -f '${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'`: installed packages only."""
    out = {}
    for line in (text or "").splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and len(parts[2].strip()) >= 2 and parts[2][1] == "i" and parts[2][0] in "ih":
            out[parts[0]] = {"version": parts[1], "held": parts[2][0] == "h"}
    return out


def parse_ip_addr(text: str) -> dict:
    """`ip -j addr show` as {ifname: {"mtu", "up", "operstate", "ipv4": [...]}}."""
    out = {}
    for link in json.loads(text or "[]"):
        flags = link.get("flags") or []
        out[link["ifname"]] = {
            "mtu": link.get("mtu"), "operstate": link.get("operstate"),
            "up": "UP" in flags and ("LOWER_UP" in flags or link.get("operstate") == "UP"),
            "ipv4": [a["local"] for a in link.get("addr_info") or [] if a.get("family") == "inet"],
        }
    return out


def gid_to_ipv4(gid: str) -> Optional[str]:
    """A RoCE GID in sysfs form (eight 4-digit groups) to its IPv4 address when it is ::ffff:a.b.c.d."""
    try:
        mapped = ipaddress.IPv6Address(gid.strip()).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped else None


def read_gid_table(hca_dir: str, port: str) -> list:
    """Every populated GID of one HCA port: [{"index", "gid", "type", "ndev", "ipv4"}], by index.

    Unused entries read as all zeros, and their gid_attrs raise EINVAL: they are skipped, like rdma-core does.
    """
    base = os.path.join(hca_dir, "ports", port)
    try:
        names = os.listdir(os.path.join(base, "gids"))
    except OSError:
        return []
    table = []
    for name in sorted((n for n in names if n.isdigit()), key=int):
        try:
            gid = _read(os.path.join(base, "gids", name)).strip()
        except OSError:
            continue
        if not gid or gid == ZERO_GID:
            continue
        try:
            gid_type = _read(os.path.join(base, "gid_attrs", "types", name)).strip()
        except OSError:
            continue
        try:
            ndev = _read(os.path.join(base, "gid_attrs", "ndevs", name)).strip() or None
        except OSError:
            ndev = None
        table.append({"index": int(name), "gid": gid, "type": gid_type, "ndev": ndev, "ipv4": gid_to_ipv4(gid)})
    return table


def read_hcas(root: str) -> dict:
    """Every RDMA device under /sys/class/infiniband: {hca: {"fw_ver", "ports": {port: [gid rows]}, "netdevs"}}."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return {}
    hcas = {}
    for hca in names:
        hca_dir = os.path.join(root, hca)
        try:
            ports = sorted((p for p in os.listdir(os.path.join(hca_dir, "ports")) if p.isdigit()), key=int)
        except OSError:
            ports = []
        tables = {port: read_gid_table(hca_dir, port) for port in ports}
        netdevs = sorted({row["ndev"] for rows in tables.values() for row in rows if row["ndev"]})
        if not netdevs:
            try:
                netdevs = sorted(os.listdir(os.path.join(hca_dir, "device", "net")))
            except OSError:
                netdevs = []
        try:
            fw_ver = _read(os.path.join(hca_dir, "fw_ver")).strip() or None
        except OSError:
            fw_ver = None
        hcas[hca] = {"fw_ver": fw_ver, "ports": tables, "netdevs": netdevs}
    return hcas
