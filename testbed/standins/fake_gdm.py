#!/usr/bin/python3
"""Stand-in for the GNOME display manager: a long-running process that marks the desktop active
(/run/testbed/desktop.pid, locked) while it runs; the engine simulator counts it as contention."""
import fcntl
import os
import signal
import sys
import time

PID_FILE = sys.argv[1] if len(sys.argv) > 1 else "/run/testbed/desktop.pid"   # the argument: for tests


def stop(*_):
    try:
        os.unlink(PID_FILE)
    except FileNotFoundError:
        pass
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
# Held until the process ends (however it ends): the simulator in a container checks the lock, since the
# container's PID namespace cannot see this pid (testbed/engine/sim.py desktop_active).
held = open(PID_FILE, "w")
fcntl.flock(held, fcntl.LOCK_EX)
held.write(str(os.getpid()))
held.flush()
while True:
    time.sleep(3600)
