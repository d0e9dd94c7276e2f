#!/usr/bin/python3
"""Stand-in for `journalctl` on a testbed host: the kernel messages of this boot and the previous one.

The host's kernel logs are /var/log/testbed-kmsg/current.log (boot 0) and previous.log (boot -1), one
`EPOCH_SECONDS MESSAGE` line each (testbed/tb/hostinit.py writes them per scenario and knob). Supported:
-k/--dmesg, -b/--boot [0|-1|ID], --list-boots, --no-pager, -q/--quiet, -o/--output short|short-iso|
short-monotonic|cat, -n/--lines N, --since/--until are refused. Output and exit codes follow systemd's
journalctl: an unknown boot prints "Data from the specified boot (-N) is not available: No such boot ID
in journal" and exits 1.
"""
import datetime
import os
import re
import socket
import sys

KMSG = "/var/log/testbed-kmsg"
BOOTS = {"0": "current", "-1": "previous"}
BOOT_IDS = {"0": "3f1c2b7a9e4d4c1b8a6f0e2d5c7b9a13", "-1": "8d2e4f6a1b3c4d5e9f7a0b1c2d3e4f5a"}


def usage_error(msg: str) -> int:
    print(f"journalctl: {msg}", file=sys.stderr)
    return 1


def read_boot(boot: str) -> list:
    path = os.path.join(KMSG, BOOTS[boot] + ".log")
    out = []
    with open(path) as fh:
        for line in fh:
            stamp, _, message = line.rstrip("\n").partition(" ")
            if stamp:
                out.append((float(stamp), message))
    return out


def fmt(entry: tuple, output: str, t0: float, host: str) -> str:
    stamp, message = entry
    when = datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc)
    if output == "cat":
        return message
    if output == "short-iso":
        return f"{when.strftime('%Y-%m-%dT%H:%M:%S+00:00')} {host} kernel: {message}"
    if output == "short-monotonic":
        return f"[{stamp - t0:12.6f}] {host} kernel: {message}"
    return f"{when.strftime('%b %d %H:%M:%S')} {host} kernel: {message}"


def main(argv: list) -> int:
    boot, output, lines, kernel, list_boots = "0", "short", None, False, False
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-k", "--dmesg"):
            kernel = True
        elif arg in ("--no-pager", "-q", "--quiet", "--no-hostname"):
            continue
        elif arg in ("-b", "--boot"):
            boot = args.pop(0) if args and re.fullmatch(r"-?\d+|[0-9a-f]{32}", args[0]) else "0"
        elif arg.startswith("--boot="):
            boot = arg.split("=", 1)[1]
        elif arg.startswith("-b") and len(arg) > 2:
            boot = arg[2:]
        elif arg in ("-o", "--output"):
            output = args.pop(0) if args else ""
        elif arg.startswith("--output="):
            output = arg.split("=", 1)[1]
        elif arg in ("-n", "--lines"):
            lines = int(args.pop(0))
        elif arg == "--list-boots":
            list_boots = True
        else:
            return usage_error(f"the testbed stand-in does not support {arg}")
    if list_boots:
        for offset in ("-1", "0"):
            if os.path.exists(os.path.join(KMSG, BOOTS[offset] + ".log")):
                entries = read_boot(offset)
                first = datetime.datetime.fromtimestamp(entries[0][0], datetime.timezone.utc) if entries else None
                last = datetime.datetime.fromtimestamp(entries[-1][0], datetime.timezone.utc) if entries else None
                print(f"{offset:>3} {BOOT_IDS[offset]} {first:%a %Y-%m-%d %H:%M:%S} UTC—{last:%a %Y-%m-%d %H:%M:%S} UTC")
        return 0
    if not kernel:
        return usage_error("the testbed stand-in only keeps kernel messages: use -k")
    if output not in ("short", "short-iso", "short-monotonic", "cat"):
        return usage_error(f"unsupported output mode {output!r}")
    boot = {v: k for k, v in BOOT_IDS.items()}.get(boot, boot)
    if boot not in BOOTS or not os.path.exists(os.path.join(KMSG, BOOTS[boot] + ".log")):
        print(f"Data from the specified boot ({boot}) is not available: No such boot ID in journal", file=sys.stderr)
        return 1
    entries = read_boot(boot)
    if lines is not None:
        entries = entries[-lines:] if lines else []
    host = socket.gethostname()
    t0 = entries[0][0] if entries else 0.0
    sys.stdout.write("".join(fmt(e, output, t0, host) + "\n" for e in entries))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
