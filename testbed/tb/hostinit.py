"""Init of one testbed host: runs inside its new mount and UTS namespace, builds its filesystem view,
then becomes its sshd. Usage: hostinit.py STATE_DIR HOST_SPEC_JSON

Overlays keep /etc, /var, /usr and /opt writable per host without touching the real machine; tmpfs
volumes give /home and /srv/archive real sizes (so free space and ENOSPC are real); the testbed folder
is bound read-only at /usr/lib/sparkfleet-testbed; stand-ins are linked over nvidia-smi, systemctl,
update-initramfs and journalctl; Debian's docker client talks to the host's own dockerd (testbed/tb/engine.py),
whose data-root is a tmpfs of the host's; /proc/meminfo is the host's own file.

What the preflight reads is per host too (preflight_view): /proc/cmdline, /proc/buddyinfo, /proc/swaps and
/proc/sys/kernel/osrelease are bound from files in /run/testbed; /proc/driver is a tmpfs holding
nvidia/version; /sys/class is a tmpfs that re-binds every real class and adds infiniband (the RoCE GID
tables of the host's address) and dmi/id; /dev/shm is the host's own tmpfs; the kernel logs of this boot and
the previous one are in /var/log/testbed-kmsg for the journalctl stand-in; eth0's MTU is real.
"""
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys

HOST_TESTBED = "/usr/lib/sparkfleet-testbed"
# The state folder as the host sees it: bound before the tmpfs mounts, which would hide a repository
# (or state folder) that lives under /tmp, /root or /home.
HOST_STATE = "/usr/lib/sparkfleet-testbed-state"


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True)


def mount(fstype: str, source: str, target: str, options: str = "") -> None:
    os.makedirs(target, exist_ok=True)
    sh("mount", "-t", fstype, *(["-o", options] if options else []), source, target)


def bind(source: str, target: str, readonly: bool = False) -> None:
    sh("mount", "--bind", source, target)
    if readonly:
        sh("mount", "-o", "remount,bind,ro", target)


def link(target: str, path: str) -> None:
    if os.path.lexists(path):
        os.unlink(path)
    os.symlink(target, path)


def main() -> None:
    state_dir, spec = sys.argv[1], json.loads(sys.argv[2])
    host_dir = os.path.join(state_dir, "hosts", spec["name"])
    testbed_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    socket.sethostname(spec["name"])
    sh("ip", "link", "set", "lo", "up")

    for top in ("etc", "var", "usr", "opt"):
        upper, work = (os.path.join(host_dir, "ovl", top, part) for part in ("upper", "work"))
        os.makedirs(upper, exist_ok=True)
        os.makedirs(work, exist_ok=True)
        mount("overlay", "overlay", f"/{top}", f"lowerdir=/{top},upperdir={upper},workdir={work}")
    os.makedirs(HOST_TESTBED, exist_ok=True)
    bind(testbed_dir, HOST_TESTBED, readonly=True)
    os.makedirs(HOST_STATE, exist_ok=True)
    bind(state_dir, HOST_STATE)
    state_dir, host_dir = HOST_STATE, os.path.join(HOST_STATE, "hosts", spec["name"])
    mount("tmpfs", "tmpfs", "/run", "mode=755")
    mount("tmpfs", "tmpfs", "/tmp", "mode=1777")
    mount("tmpfs", "tmpfs", "/root", "mode=700,size=64m")
    mount("tmpfs", "tmpfs", "/home", f"mode=755,size={spec['home_size']}")
    mount("tmpfs", "tmpfs", "/srv", "mode=755,size=16m")
    mount("tmpfs", "tmpfs", "/srv/archive", f"mode=755,size={spec['archive_size']}")

    standins = f"{HOST_TESTBED}/standins"
    tools = {"/usr/bin/nvidia-smi": f"{standins}/nvidia_smi.py",
             "/usr/sbin/update-initramfs": f"{standins}/update_initramfs.sh",
             "/usr/bin/journalctl": f"{standins}/journalctl.py",
             "/usr/bin/systemctl": f"{standins}/systemctl.py"}   # in front of state_dir/systemctl3.py
    # A real dockerd per host (testbed/tb/engine.py): Debian's docker client, and the GPU hook dockerd looks
    # for on its PATH to register `--gpus`.
    link("/usr/bin/docker", "/usr/local/bin/docker")
    link(f"{standins}/nvidia_container_runtime_hook.py", "/usr/local/bin/nvidia-container-runtime-hook")
    # runc by name on dockerd's PATH: lowers a resource limit this machine's root may not raise (memlock).
    link(f"{standins}/runc.py", "/usr/local/sbin/runc")
    private_dev()
    cgroups()
    # dockerd's data-root on its own tmpfs: overlay2 needs an upper folder that is not on overlayfs (the
    # host's /var is an overlay), and a tmpfs is private to the host and gone with its mount namespace.
    mount("tmpfs", "tmpfs", "/var/lib/docker", f"mode=710,size={spec.get('docker_root_size', '2g')}")
    for path, target in tools.items():
        link(target, path)
        # A same-named tool earlier on PATH (the machine's own docker client in /usr/local/bin) is shadowed.
        for local in ("/usr/local/bin", "/usr/local/sbin"):
            shadow = os.path.join(local, os.path.basename(path))
            if os.path.lexists(shadow):
                link(target, shadow)

    # The head exports the checkpoint; a worker sees that export only through the docker volume.
    checkpoint = os.path.join(state_dir, "checkpoint")
    if spec["rank"] == 0:
        target = "/srv/models/DeepSeek-V4.1-Flash"
    else:
        target = f"/run/testbed/nfs/{spec['head_address']}/srv/models/DeepSeek-V4.1-Flash"
    if spec.get("checkpoint_corrupt"):
        checkpoint = corrupted_copy(checkpoint, os.path.join(host_dir, "checkpoint-private"),
                                    spec["checkpoint_corrupt"])
    if spec.get("export_unreadable"):
        # Like an export without crossmnt: the worker's mount of the head's export fails (a bind-backed
        # volume whose source is missing: dockerd says "failed to mount local volume").
        os.makedirs(os.path.dirname(target), exist_ok=True)
    else:
        os.makedirs(target, exist_ok=True)
        bind(checkpoint, target, readonly=True)

    os.makedirs("/run/testbed", exist_ok=True)
    with open("/run/testbed/host.json", "w") as fh:
        json.dump(spec, fh, indent=1)
    with open("/run/testbed/meminfo", "w") as fh:
        fh.write(meminfo(spec["mem_available_kb"], *spec.get("cma_kb", (0, 0))))
    bind("/run/testbed/meminfo", "/proc/meminfo")
    preflight_view(spec)

    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    config = os.path.join(host_dir, "sshd_config")
    os.execv("/usr/sbin/sshd", ["/usr/sbin/sshd", "-D", "-e", "-f", config,
                                "-E", os.path.join(host_dir, "sshd.log")])


def private_dev() -> None:
    """/dev as a tmpfs that re-binds every entry of the machine's /dev, plus stand-in RDMA device nodes in
    /dev/infiniband (a ConnectX-7's uverbs and rdma_cm) for the recipe's `--device /dev/infiniband`."""
    real = "/run/testbed/.dev"
    os.makedirs(real, exist_ok=True)
    bind("/dev", real)
    mount("tmpfs", "tmpfs", "/dev", "mode=755,size=1m")
    for name in sorted(os.listdir(real)):
        source, target = os.path.join(real, name), os.path.join("/dev", name)
        if os.path.islink(source):
            os.symlink(os.readlink(source), target)
        elif os.path.isdir(source):
            os.makedirs(target, exist_ok=True)
            sh("mount", "--rbind", source, target)
        else:
            open(target, "w").close()
            sh("mount", "--bind", source, target)
    sh("umount", "-l", real)
    os.rmdir(real)
    os.makedirs("/dev/infiniband", exist_ok=True)
    for name, major, minor in (("uverbs0", 231, 192), ("uverbs1", 231, 193), ("rdma_cm", 10, 58)):
        os.mknod(f"/dev/infiniband/{name}", 0o20666, os.makedev(major, minor))


def cgroups() -> None:
    """The machine's cgroup hierarchies at /sys/fs/cgroup, as dockerd needs them: `ip netns exec` mounted a
    fresh sysfs for the host, without them. The same hierarchies as the machine's (mounted from /proc/1/mounts'
    entries, so a container's cgroup is the same one the machine sees); dockerd's --cgroup-parent keeps each
    host's containers in their own folder."""
    with open("/proc/1/mounts") as fh:
        entries = [line.split() for line in fh]
    top = [e for e in entries if e[1] == "/sys/fs/cgroup"]
    if top and top[0][2] == "cgroup2":
        mount("cgroup2", "cgroup2", "/sys/fs/cgroup")
        return
    mount("tmpfs", "tmpfs", "/sys/fs/cgroup", "mode=755,size=1m")
    for source, target, fstype, options, *_ in entries:
        if fstype == "cgroup" and target.startswith("/sys/fs/cgroup/"):
            wanted = ",".join(o for o in options.split(",") if o not in ("rw", "relatime"))
            mount("cgroup", source, target, wanted)


def corrupted_copy(checkpoint: str, private: str, corrupt: dict) -> str:
    """A private copy of the checkpoint with one byte flipped in the middle of one file (mtime kept)."""
    if os.path.exists(private):
        shutil.rmtree(private)
    shutil.copytree(checkpoint, private)
    path = os.path.join(private, corrupt["file"])
    st = os.stat(path)
    os.chmod(path, 0o644)
    with open(path, "r+b") as fh:
        fh.seek(st.st_size // 2)
        byte = fh.read(1)
        fh.seek(st.st_size // 2)
        fh.write(bytes([byte[0] ^ 0x01]))
    os.chmod(path, 0o444)
    # The same size and mtime as the good file: only a hash can tell them apart.
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with open(os.path.join(private, ".sparkfleet-corrupted.json"), "w") as fh:
        json.dump({"file": corrupt["file"], "offset": st.st_size // 2}, fh)
    return private


def preflight_view(spec: dict) -> None:
    """Per-host stand-ins for what library/node_preflight_info reads (docs/reference.md section 11)."""
    view = "/run/testbed/preflight"
    os.makedirs(view, exist_ok=True)

    def put(name: str, text: str, over: str) -> None:
        path = os.path.join(view, name)
        with open(path, "w") as fh:
            fh.write(text)
        bind(path, over)

    put("osrelease", spec["kernel_release"] + "\n", "/proc/sys/kernel/osrelease")
    put("cmdline", spec["cmdline"] + "\n", "/proc/cmdline")
    put("buddyinfo", buddyinfo(spec["buddy"], spec["mem_available_kb"] - 1_800_000), "/proc/buddyinfo")
    swaps = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
    if spec["swap_kb"]:
        swaps += f"/swap.img                               file\t\t{spec['swap_kb']}\t\t0\t\t-2\n"
    put("swaps", swaps, "/proc/swaps")

    mount("tmpfs", "tmpfs", "/proc/driver", "mode=755,size=1m")
    os.makedirs("/proc/driver/nvidia", exist_ok=True)
    flavour = "NVIDIA UNIX Open Kernel Module for aarch64" if spec["driver_flavour"] == "open" \
        else "NVIDIA UNIX aarch64 Kernel Module"
    with open("/proc/driver/nvidia/version", "w") as fh:
        fh.write(f"NVRM version: {flavour}  {spec['driver']}  Release Build  (dvs-builder@U22-I3-AF03-09-1)  "
                 "Wed Oct 22 19:12:38 UTC 2025\nGCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n")

    sys_class(spec)
    mount("tmpfs", "tmpfs", "/dev/shm", f"mode=1777,size={spec['shm_size']}")
    # The veth's host end (eth0) is made at the default 1500: set the fabric MTU (knob mtu1500 keeps 1500).
    sh("ip", "link", "set", "dev", "eth0", "mtu", str(spec["mtu"]))

    kmsg = "/var/log/testbed-kmsg"
    os.makedirs(kmsg, exist_ok=True)
    for boot, kind in (("current", spec["kmsg_current"]), ("previous", spec["kmsg_previous"])):
        with open(os.path.join(kmsg, f"{boot}.log"), "w") as fh:
            fh.write("\n".join(kernel_log(spec, kind, boot)) + "\n")


def buddyinfo(kind: str, free_kb: int) -> str:
    """/proc/buddyinfo of a GB10 (4 KiB pages, orders 0..10) whose free pages add up to MemFree."""
    pages = free_kb // 4
    if kind == "fragmented":
        # Hours of serving: the free memory is all in small blocks; nothing of order 9 or more.
        shares = [0.22, 0.26, 0.22, 0.14, 0.08, 0.05, 0.02, 0.01, 0.0, 0.0, 0.0]
    else:
        shares = [0.0004, 0.0006, 0.0008, 0.001, 0.0012, 0.0015, 0.002, 0.003, 0.004, 0.006, 0.9795]
    normal = [int(pages * share) >> order for order, share in enumerate(shares)]
    dma = [3, 2, 1, 2, 1, 1, 0, 1, 1, 1, 0 if kind == "fragmented" else 380]
    row = lambda zone, counts: f"Node 0, zone {zone:>8} " + " ".join(f"{c:6d}" for c in counts) + " "
    return row("DMA", dma) + "\n" + row("Normal", normal) + "\n"


def sys_class(spec: dict) -> None:
    """/sys/class as a tmpfs: every real class re-bound in place, plus infiniband and dmi of this host."""
    real = "/run/testbed/.sysclass"
    os.makedirs(real, exist_ok=True)
    bind("/sys/class", real)
    mount("tmpfs", "tmpfs", "/sys/class", "mode=755,size=4m")
    for name in sorted(os.listdir(real)):
        os.makedirs(f"/sys/class/{name}", exist_ok=True)
        bind(os.path.join(real, name), f"/sys/class/{name}")
    sh("umount", "-l", real)
    os.rmdir(real)

    def put(path: str, text: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text + "\n")

    put("/sys/class/dmi/id/bios_version", spec["bios_version"])
    put("/sys/class/dmi/id/product_name", "NVIDIA DGX Spark")
    mac_tail = f"{spec['rank'] + 1:02x}"
    link_local = f"fe80:0000:0000:0000:5e00:10ff:fe13:{mac_tail}00"
    v4 = ipaddress.IPv6Address("::ffff:" + spec["address"]).exploded
    rows = [(link_local, "IB/RoCE v1"), (link_local, "RoCE v2")]
    for extra in range(spec["gid_extra_pairs"]):
        global6 = ipaddress.IPv6Address(f"fd00:213::{spec['rank'] + 1:x}:{extra + 1:x}").exploded
        rows += [(global6, "IB/RoCE v1"), (global6, "RoCE v2")]
    rows += [(v4, "IB/RoCE v1"), (v4, "RoCE v2")]
    # Two HCAs like a GB10's ConnectX-7: the fabric one on eth0; the second port's interface is unplugged.
    for hca, ndev, table in (("rocep1s0f0", "eth0", rows),
                             ("rocep1s0f1", "enp1s0f1np1", [(link_local.replace("fe13", "fe14"), "IB/RoCE v1"),
                                                            (link_local.replace("fe13", "fe14"), "RoCE v2")])):
        base = f"/sys/class/infiniband/{hca}"
        put(f"{base}/fw_ver", spec["hca_fw"])
        put(f"{base}/node_type", "1: CA")
        put(f"{base}/ports/1/state", "4: ACTIVE")
        put(f"{base}/ports/1/link_layer", "Ethernet")
        os.makedirs(f"{base}/device/net/{ndev}", exist_ok=True)
        for index in range(16):
            gid, gid_type = table[index] if index < len(table) else ("0000:" * 7 + "0000", None)
            put(f"{base}/ports/1/gids/{index}", gid)
            if gid_type:   # unused entries have no readable attributes (EINVAL on a real HCA)
                put(f"{base}/ports/1/gid_attrs/types/{index}", gid_type)
                put(f"{base}/ports/1/gid_attrs/ndevs/{index}", ndev)


def kernel_log(spec: dict, kind: str, boot: str) -> list:
    """Kernel messages of one boot as `SECONDS MESSAGE` lines (the journalctl stand-in formats them)."""
    t0 = 1_764_390_000 if boot == "current" else 1_764_300_000
    driver = ("NVIDIA UNIX Open Kernel Module for aarch64" if spec["driver_flavour"] == "open"
              else "NVIDIA UNIX aarch64 Kernel Module")
    lines = [
        (0.0, f"Linux version {spec['kernel_release']} (buildd@bos03-arm64-041) (aarch64-linux-gnu-gcc-13) "
              "#19-Ubuntu SMP PREEMPT_DYNAMIC"),
        (0.0, f"Kernel command line: {spec['cmdline']}"),
        (0.0, "cma: Reserved 64 MiB at 0x00000000f8000000"),
        (2.1, "mlx5_core 0000:01:00.0: firmware version: " + spec["hca_fw"]),
        (2.4, "pcieport 000f:00:00.0: AER: Corrected error message received from 000f:01:00.0"),
        (2.4, "pcieport 000f:00:00.0: AER: Uncorrected (Non-Fatal) error message received from 000f:00:00.0"),
        (3.9, f"nvidia: loading out-of-tree module taints kernel."),
        (4.0, f"NVRM: loading {driver}  {spec['driver']}  Release Build  (dvs-builder@U22-I3-AF03-09-1)"),
        (5.2, "mlx5_core 0000:01:00.0 eth0: Link up"),
        (812.4, "NVRM: Xid (PCI:000f:01:00): 13, pid=48213, name=python3, Graphics Exception: ESR 0x51dd30=0x0"),
    ]
    if kind == "wedge":
        lines += [
            (18_342.1, "NVRM: nvAssertOkFailedNoLog: Assertion failed: Out of memory [NV_ERR_NO_MEMORY] "
                       "(0x00000051) returned from pRmApi->AllocWithHandle(pRmApi, hClient, hParent, hObject, "
                       "NV01_MEMORY_SYSTEM, &params, sizeof(params)) @ mem_mgr.c:1542"),
            (18_342.2, "NVRM: Xid (PCI:000f:01:00): 79, pid=51877, name=python3, GPU has fallen off the bus."),
            (18_401.7, "INFO: task python3:51877 blocked for more than 122 seconds."),
        ]
    return [f"{t0 + offset:.6f} {message}" for offset, message in lines]


def meminfo(available_kb: int, cma_total_kb: int = 0, cma_free_kb: int = 0) -> str:
    total = 127_587_400
    free = available_kb - 1_800_000
    fields = [
        ("MemTotal", total), ("MemFree", free), ("MemAvailable", available_kb), ("Buffers", 61_200),
        ("Cached", 1_702_400), ("SwapCached", 0), ("Active", 1_204_300), ("Inactive", 1_150_700),
        ("Active(anon)", 602_100), ("Inactive(anon)", 0), ("Active(file)", 602_200),
        ("Inactive(file)", 1_150_700), ("Unevictable", 0), ("Mlocked", 0), ("SwapTotal", 0),
        ("SwapFree", 0), ("Zswap", 0), ("Zswapped", 0), ("Dirty", 48), ("Writeback", 0),
        ("AnonPages", 590_900), ("Mapped", 321_500), ("Shmem", 12_100), ("KReclaimable", 95_300),
        ("Slab", 301_800), ("SReclaimable", 95_300), ("SUnreclaim", 206_500), ("KernelStack", 18_400),
        ("PageTables", 9_800), ("SecPageTables", 0), ("NFS_Unstable", 0), ("Bounce", 0),
        ("WritebackTmp", 0), ("CommitLimit", total // 2), ("Committed_AS", 4_812_300),
        ("VmallocTotal", 133_141_626_880), ("VmallocUsed", 61_300), ("VmallocChunk", 0),
        ("Percpu", 17_920), ("HardwareCorrupted", 0), ("AnonHugePages", 0), ("ShmemHugePages", 0),
        ("ShmemPmdMapped", 0), ("FileHugePages", 0), ("FilePmdMapped", 0), ("CmaTotal", cma_total_kb),
        ("CmaFree", cma_free_kb), ("HugePages_Total", None), ("HugePages_Free", None), ("HugePages_Rsvd", None),
        ("HugePages_Surp", None), ("Hugepagesize", 2048), ("Hugetlb", 0),
    ]
    lines = []
    for key, value in fields:
        if value is None:
            lines.append(f"{key + ':':<16}{0:>8}")
        else:
            lines.append(f"{key + ':':<16}{value:>8} kB")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
