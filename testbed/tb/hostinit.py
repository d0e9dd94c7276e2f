"""Init of one testbed host: runs inside its new mount and UTS namespace, builds its filesystem view,
then becomes its sshd. Usage: hostinit.py STATE_DIR HOST_SPEC_JSON

Overlays keep /etc, /var, /usr and /opt writable per host without touching the real machine; tmpfs
volumes give /home and /srv/archive real sizes (so free space and ENOSPC are real); the testbed folder
is bound read-only at /usr/lib/sparkfleet-testbed; stand-ins are linked over nvidia-smi, docker,
systemctl and update-initramfs; /proc/meminfo is the host's own file.
"""
import json
import os
import socket
import subprocess
import sys

HOST_TESTBED = "/usr/lib/sparkfleet-testbed"


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
    mount("tmpfs", "tmpfs", "/run", "mode=755")
    mount("tmpfs", "tmpfs", "/tmp", "mode=1777")
    mount("tmpfs", "tmpfs", "/root", "mode=700,size=64m")
    mount("tmpfs", "tmpfs", "/home", f"mode=755,size={spec['home_size']}")
    mount("tmpfs", "tmpfs", "/srv", "mode=755,size=16m")
    mount("tmpfs", "tmpfs", "/srv/archive", f"mode=755,size={spec['archive_size']}")

    os.makedirs(HOST_TESTBED, exist_ok=True)
    bind(testbed_dir, HOST_TESTBED, readonly=True)
    standins = f"{HOST_TESTBED}/standins"
    tools = {"/usr/bin/nvidia-smi": f"{standins}/nvidia_smi.py", "/usr/bin/docker": f"{standins}/docker.py",
             "/usr/sbin/update-initramfs": f"{standins}/update_initramfs.sh",
             "/usr/bin/systemctl": os.path.join(state_dir, "systemctl3.py")}
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
    os.makedirs(target, exist_ok=True)
    bind(checkpoint, target, readonly=True)

    os.makedirs("/run/testbed", exist_ok=True)
    with open("/run/testbed/host.json", "w") as fh:
        json.dump(spec, fh, indent=1)
    with open("/run/testbed/meminfo", "w") as fh:
        fh.write(meminfo(spec["mem_available_kb"]))
    bind("/run/testbed/meminfo", "/proc/meminfo")

    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    config = os.path.join(host_dir, "sshd_config")
    os.execv("/usr/sbin/sshd", ["/usr/sbin/sshd", "-D", "-e", "-f", config,
                                "-E", os.path.join(host_dir, "sshd.log")])


def meminfo(available_kb: int) -> str:
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
        ("ShmemPmdMapped", 0), ("FileHugePages", 0), ("FilePmdMapped", 0), ("CmaTotal", 0),
        ("CmaFree", 0), ("HugePages_Total", None), ("HugePages_Free", None), ("HugePages_Rsvd", None),
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
