"""NCCL's IB/RoCE transport set-up as a simulated rank does it (docs/reference.md section 11: the RoCE v2 GID index
differs per node and moves after reboots; a stale pin fails on one rank only).

The rank reads the same stand-in sysfs tables the preflight reads (/sys/class/infiniband/<hca>/ports/<p>/gids/*,
gid_attrs/types/*, gid_attrs/ndevs/*) and its out-of-band address (the source address towards HEAD_IP:DIST_PORT,
as NCCL's bootstrap picks it). Then, like NCCL:

- ``NCCL_IB_HCA`` (``[^|=]name[:port][,name[:port]...]``, prefix match unless ``=``; ``^`` excludes) selects the
  devices; unset, the devices whose GID table carries the out-of-band address (the NIC NCCL would use).
- ``NCCL_IB_GID_INDEX`` set: that GID of every selected port is used; unset: the RoCE v2 GID of the out-of-band
  address is selected (what NCCL's auto-selection does since 2.21).
- A used GID that is not the RoCE v2 GID of this rank's address cannot carry the queue pairs: NCCL fails the
  connection (``ibv_modify_qp failed with 110 Connection timed out``) on this rank. The simulator reports it at
  rendezvous, so the boot fails naming the rank.

Log lines (NCCL_DEBUG=INFO style; the ``GID index`` line is the simulator's own summary):

    NCCL INFO NCCL_IB_HCA set to rocep1s0f0:1
    NCCL INFO NCCL_IB_GID_INDEX set by environment to 3.
    NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE [RO]; OOB eth0:10.213.0.11<0>
    NCCL INFO NET/IB : rocep1s0f0:1 GID index 3 (RoCE v2 ::ffff:10.213.0.11)
    NCCL WARN NET/IB : rocep1s0f0:1 GID index 3 is RoCE v2 fd00:213::3:1, not ::ffff:10.213.0.13 ...

Standard library only; pure functions over a sysfs root, unit-tested with a fixture tree.
"""
from __future__ import annotations

import ipaddress
import os
import socket

ROCE_V2 = "RoCE v2"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def gid_table(root: str, hca: str, port: str) -> dict:
    """{index: {"gid", "type", "ndev", "ipv4"}} of the populated GIDs of one port."""
    base = os.path.join(root, hca, "ports", port)
    table = {}
    try:
        names = os.listdir(os.path.join(base, "gids"))
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        gid = _read(os.path.join(base, "gids", name))
        if not gid or gid == ZERO_GID:
            continue
        gid_type = _read(os.path.join(base, "gid_attrs", "types", name))
        if gid_type is None:
            continue
        try:
            mapped = ipaddress.IPv6Address(gid).ipv4_mapped
        except ValueError:
            mapped = None
        table[int(name)] = {"gid": str(ipaddress.IPv6Address(gid)) if mapped is None else f"::ffff:{mapped}",
                            "type": gid_type, "ndev": _read(os.path.join(base, "gid_attrs", "ndevs", name)),
                            "ipv4": str(mapped) if mapped else None}
    return table


def devices(root: str) -> dict:
    """{hca: {port: gid table}} of every RDMA device under root."""
    out = {}
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    for hca in names:
        try:
            ports = sorted(p for p in os.listdir(os.path.join(root, hca, "ports")) if p.isdigit())
        except OSError:
            continue
        out[hca] = {port: gid_table(root, hca, port) for port in ports}
    return out


def parse_hca(spec: str) -> tuple:
    """NCCL_IB_HCA -> (exclude, exact, [(name, port or None)])."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    spec = spec.lstrip("=")
    items = []
    for part in spec.split(","):
        part = part.strip()
        if part:
            name, _, port = part.partition(":")
            items.append((name, port or None))
    return exclude, exact, items


def select(devs: dict, hca_env: str | None, address: str) -> list:
    """[(hca, port)] NCCL would use."""
    ports = [(hca, port) for hca in sorted(devs) for port in sorted(devs[hca])]
    if hca_env:
        exclude, exact, items = parse_hca(hca_env)

        def hit(hca, port):
            return any((hca == name if exact else hca.startswith(name)) and (want is None or want == port)
                       for name, want in items)
        return [p for p in ports if hit(*p) != exclude]
    carrying = [(h, p) for h, p in ports if any(r["ipv4"] == address for r in devs[h][p].values())]
    return carrying or ports[:1]


def oob_address(head: str, port: int) -> str:
    """The source address this host uses towards the head (NCCL's bootstrap interface address)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.connect((head, port))
        return sock.getsockname()[0]
    except OSError:
        return head
    finally:
        sock.close()


def setup(env: dict, address: str, root: str = "/sys/class/infiniband") -> dict:
    """{"ok", "error", "lines", "gid_index", "hcas"}: what this rank's NCCL would do with its env on this host."""
    lines: list = []
    hca_env = env.get("NCCL_IB_HCA") or None
    gid_env = env.get("NCCL_IB_GID_INDEX")
    if hca_env:
        lines.append(f"NCCL INFO NCCL_IB_HCA set to {hca_env}")
    pinned = None
    if gid_env not in (None, ""):
        try:
            pinned = int(gid_env)
        except ValueError:
            return {"ok": False, "error": f"NCCL_IB_GID_INDEX={gid_env!r} is not an integer", "lines": lines,
                    "gid_index": None, "hcas": []}
        lines.append(f"NCCL INFO NCCL_IB_GID_INDEX set by environment to {pinned}.")
    devs = devices(root)
    if not devs:
        lines += ["NCCL INFO NET/IB : No device found.", f"NCCL INFO NET/Socket : Using [0]eth0:{address}<0>"]
        return {"ok": True, "error": None, "lines": lines, "gid_index": None, "hcas": []}
    used = select(devs, hca_env, address)
    if not used:
        return {"ok": False, "error": f"NCCL_IB_HCA={hca_env} matches no device (devices: {', '.join(sorted(devs))})",
                "lines": lines, "gid_index": None, "hcas": []}
    want = f"::ffff:{address}"
    ndev = next((r["ndev"] for h, p in used for r in devs[h][p].values() if r["ndev"]), "eth0")
    lines.append("NCCL INFO NET/IB : Using " + " ".join(f"[{i}]{h}:{p}/RoCE" for i, (h, p) in enumerate(used))
                 + f" [RO]; OOB {ndev}:{address}<0>")
    errors, indices = [], []
    for hca, port in used:
        table = devs[hca][port]
        if pinned is None:
            index = next((i for i, r in sorted(table.items()) if r["type"] == ROCE_V2 and r["ipv4"] == address), None)
            if index is None:
                errors.append(f"{hca}:{port} has no RoCE v2 GID for {want} (auto-selection)")
                continue
        else:
            index = pinned
        indices.append(index)
        row = table.get(index)
        if row is None:
            errors.append(f"{hca}:{port} GID index {index} is not populated (populated: "
                          f"{', '.join(str(i) for i in sorted(table)) or 'none'})")
            continue
        lines.append(f"NCCL INFO NET/IB : {hca}:{port} GID index {index} ({row['type']} {row['gid']})"
                     + ("" if pinned is not None else " auto-selected"))
        if row["type"] != ROCE_V2 or row["ipv4"] != address:
            right = next((i for i, r in sorted(table.items()) if r["type"] == ROCE_V2 and r["ipv4"] == address), None)
            errors.append(f"{hca}:{port} GID index {index} is {row['type']} {row['gid']}, not the RoCE v2 GID of "
                          f"{address} ({want}" + (f", index {right} here" if right is not None else "") + ")")
    if errors:
        error = "; ".join(errors) + (": ibv_modify_qp failed with 110 Connection timed out, curr state INIT, "
                                     f"next state RTR (NCCL_IB_GID_INDEX={gid_env if gid_env else 'unset'})")
        lines.append(f"NCCL WARN NET/IB : {error}")
        return {"ok": False, "error": error, "lines": lines, "gid_index": indices[0] if indices else None,
                "hcas": [f"{h}:{p}" for h, p in used]}
    return {"ok": True, "error": None, "lines": lines, "gid_index": indices[0] if len(set(indices)) == 1 else indices,
            "hcas": [f"{h}:{p}" for h, p in used]}
