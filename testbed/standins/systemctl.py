#!/usr/bin/python3
"""Front of a testbed host's systemd stand-in (docker-systemctl-replacement's systemctl3.py, which keeps no
state-change times): like systemd, it remembers when a unit entered the active and the inactive state, and
`systemctl show UNIT` prints ActiveEnterTimestamp, InactiveEnterTimestamp and StateChangeTimestamp in systemd's
format (`Wed 2026-12-02 06:09:33 UTC`; the hosts run in UTC; empty when the unit never entered the state, as
systemd prints it). Every other call, and every other line, is systemctl3.py's own."""
import fcntl
import json
import os
import subprocess
import sys
import time

REAL = os.environ.get("TESTBED_SYSTEMCTL3", "/usr/lib/sparkfleet-testbed-state/systemctl3.py")   # tests set these
TIMES = os.environ.get("TESTBED_SYSTEMD_TIMES", "/run/testbed/systemd-times.json")
UNIT_DIR = os.environ.get("TESTBED_UNIT_DIR", "/etc/systemd/system")
CHANGING = {"start", "stop", "restart", "try-restart", "reload-or-restart", "reload-or-try-restart",
            "condrestart", "force-reload", "kill"}
RESTARTS = {"restart", "try-restart", "reload-or-restart", "reload-or-try-restart", "condrestart", "force-reload"}
PROPS = ("ActiveEnterTimestamp", "InactiveEnterTimestamp", "StateChangeTimestamp")
WITH_VALUE = {"-p", "--property", "-t", "--type", "--root", "-n", "--lines", "-o", "--output", "-s", "--signal",
              "--state", "--kill-who", "-H", "--host", "-M", "--machine"}


def positional(argv):
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return out


def properties(argv):
    props, it = [], iter(argv)
    for arg in it:
        if arg in ("-p", "--property"):
            props += next(it, "").split(",")
        elif arg.startswith("--property="):
            props += arg.split("=", 1)[1].split(",")
        elif arg.startswith("-p") and len(arg) > 2:
            props += arg[2:].split(",")
    return props


def unit_name(name):
    name = name if "." in name else name + ".service"
    path = os.path.join(UNIT_DIR, name)
    return os.path.basename(os.readlink(path)) if os.path.islink(path) else name


def is_active(unit):
    return subprocess.run([REAL, "is-active", unit], capture_output=True, text=True).stdout.strip()


def stamp(unit, state, when, times):
    times.setdefault(unit, {})[state] = when
    times[unit]["change"] = when


def systemd_time(epoch):
    return "" if epoch is None else time.strftime("%a %Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def main(argv):
    words = positional(argv)
    verb = words[0] if words else ""
    if verb in CHANGING:
        units = [unit_name(u) for u in words[1:]]
        before = {u: is_active(u) for u in units}
        rc = subprocess.call([REAL] + argv)
        now = time.time()
        with open(TIMES + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                times = json.load(open(TIMES))
            except (OSError, ValueError):
                times = {}
            for u in units:
                after = is_active(u)
                if after == "active" and (before[u] != "active" or verb in RESTARTS):
                    if before[u] == "active":
                        stamp(u, "inactive", now, times)
                    stamp(u, "active", now, times)
                elif after != "active" and before[u] == "active":
                    stamp(u, "inactive", now, times)
            tmp = TIMES + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(times, fh)
            os.replace(tmp, TIMES)
        return rc
    if verb == "show" and len(words) == 2:
        wanted = properties(argv)
        extra = [p for p in PROPS if not wanted or p in wanted]
        if extra:
            proc = subprocess.run([REAL] + argv, capture_output=True, text=True)
            sys.stderr.write(proc.stderr)
            try:
                times = json.load(open(TIMES)).get(unit_name(words[1]), {})
            except (OSError, ValueError):
                times = {}
            keys = {"ActiveEnterTimestamp": "active", "InactiveEnterTimestamp": "inactive", "StateChangeTimestamp": "change"}
            text = proc.stdout + "".join(f"{p}={systemd_time(times.get(keys[p]))}\n" for p in extra)
            sys.stdout.write(text)
            return proc.returncode
    os.execv(REAL, [REAL] + argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
