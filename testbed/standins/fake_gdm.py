#!/usr/bin/python3
"""Stand-in for the GNOME display manager: a long-running process that marks the desktop active
(/run/testbed/desktop.pid) while it runs; the engine simulator counts it as contention."""
import os
import signal
import sys
import time

PID_FILE = "/run/testbed/desktop.pid"


def stop(*_):
    try:
        os.unlink(PID_FILE)
    except FileNotFoundError:
        pass
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
with open(PID_FILE, "w") as fh:
    fh.write(str(os.getpid()))
while True:
    time.sleep(3600)
