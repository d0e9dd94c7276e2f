#!/usr/bin/python3
"""runc as dockerd's default runtime sees it on a testbed host (engine `docker`): the real /usr/sbin/runc, with
one difference. This machine's root lacks CAP_SYS_RESOURCE, so the kernel refuses the recipe's
`--ulimit memlock=-1:-1` ("error setting rlimit type 8: operation not permitted"); a DGX Spark's root has it.
For `runc create` (and the process of `runc exec`), a resource limit above what this machine allows is lowered to that limit in the bundle's
config.json (the container's HostConfig keeps the recipe's value: `docker inspect` shows what was asked); for the
same reason a capability outside this machine's bounding set (CAP_SYS_RESOURCE, which `--privileged` asks for)
is left out of the container's sets. Both are logged to /run/testbed/runc-rlimits.log. Everything else is runc unchanged (it is found by
name on dockerd's PATH, where hostinit links this file first).
"""
import json
import os
import resource
import sys

RUNC = "/usr/sbin/runc"
LOG = "/run/testbed/runc-rlimits.log"
UNLIMITED = 2 ** 64 - 1
CAPS = ["CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
        "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
        "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
        "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
        "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF",
        "CHECKPOINT_RESTORE"]


def bounding() -> set:
    with open("/proc/self/status") as fh:
        mask = int(next(line for line in fh if line.startswith("CapBnd:")).split()[1], 16)
    return {"CAP_" + name for bit, name in enumerate(CAPS) if mask >> bit & 1}


def clamp_process(process: dict) -> list:
    """Lower rlimits and leave out capabilities this machine's root cannot give (in place); what changed."""
    lowered = []
    for item in process.get("rlimits", []) or []:
        name = item["type"].replace("RLIMIT_", "")
        allowed = resource.getrlimit(getattr(resource, "RLIMIT_" + name))[1]
        allowed = UNLIMITED if allowed == resource.RLIM_INFINITY else allowed
        if item["hard"] > allowed:
            lowered.append({"type": item["type"], "asked": [item["soft"], item["hard"]], "set": allowed})
            item["hard"] = allowed
            item["soft"] = min(item["soft"], allowed)
    allowed_caps = bounding()
    dropped = set()
    for kind, caps in (process.get("capabilities") or {}).items():
        keep = [cap for cap in caps if cap in allowed_caps]
        dropped.update(set(caps) - set(keep))
        process["capabilities"][kind] = keep
    if dropped:
        lowered.append({"capabilities_left_out": sorted(dropped)})
    return lowered


def rewrite(path: str, is_process: bool) -> None:
    with open(path) as fh:
        data = json.load(fh)
    lowered = clamp_process(data if is_process else data.setdefault("process", {}))
    if lowered:
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
        try:
            with open(LOG, "a") as fh:
                fh.write(json.dumps({"file": path, "lowered": lowered}) + "\n")
        except OSError:
            pass


def _value(args: list, *flags: str):
    for index, arg in enumerate(args):
        if arg in flags and index + 1 < len(args):
            return args[index + 1]
        for flag in flags:
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return None


def main() -> None:
    args = sys.argv[1:]
    if "create" in args or "run" in args:
        rewrite(os.path.join(_value(args, "--bundle", "-b") or os.getcwd(), "config.json"), is_process=False)
    elif "exec" in args:
        process = _value(args, "--process", "-p")
        if process:
            rewrite(process, is_process=True)
    os.execv(RUNC, [RUNC] + args)


if __name__ == "__main__":
    main()
