"""testbed/standins/systemctl.py: the systemd stand-in's front remembers state-change times as systemd does and
prints them in `systemctl show` (the rollout's boot-currency guard reads the display manager's)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

FRONT = Path(__file__).resolve().parents[2] / "testbed" / "standins" / "systemctl.py"
# A replacement that keeps each unit's state in a file: start/stop/restart, is-active, show -p ActiveState.
FAKE = """#!{python}
import os, sys
state = os.path.join({root!r}, "state-")
args = [a for a in sys.argv[1:] if not a.startswith("-")]
def resolve(u):
    u = u if "." in u else u + ".service"
    link = os.path.join({root!r}, "units", u)
    return os.path.basename(os.readlink(link)) if os.path.islink(link) else u
verb, units = args[0], [resolve(u) for u in args[1:]]
if verb in ("start", "restart"):
    for u in units: open(state + u, "w").write("active")
elif verb == "stop":
    for u in units: open(state + u, "w").write("inactive")
elif verb == "is-active":
    word = open(state + units[0]).read() if os.path.exists(state + units[0]) else "inactive"
    print(word); sys.exit(0 if word == "active" else 3)
elif verb == "show":
    word = open(state + units[0]).read() if os.path.exists(state + units[0]) else "inactive"
    print("Id=" + units[0]); print("ActiveState=" + word)
"""


def run(tmp_path, *argv):
    env = dict(os.environ, TESTBED_SYSTEMCTL3=str(tmp_path / "systemctl3.py"),
               TESTBED_SYSTEMD_TIMES=str(tmp_path / "times.json"), TESTBED_UNIT_DIR=str(tmp_path / "units"))
    return subprocess.run([sys.executable, str(FRONT), *argv], env=env, capture_output=True, text=True)


def setup(tmp_path):
    (tmp_path / "units").mkdir()
    (tmp_path / "units" / "gdm.service").write_text("[Service]\n")
    os.symlink(tmp_path / "units" / "gdm.service", tmp_path / "units" / "display-manager.service")
    fake = tmp_path / "systemctl3.py"
    fake.write_text(FAKE.format(python=sys.executable, root=str(tmp_path)))
    fake.chmod(0o755)


def show(tmp_path, unit="gdm.service"):
    out = run(tmp_path, "show", unit, "-p", "ActiveState,ActiveEnterTimestamp,InactiveEnterTimestamp").stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_a_unit_never_changed_shows_empty_times_as_systemd_does(tmp_path):
    setup(tmp_path)
    assert show(tmp_path) == {"Id": "gdm.service", "ActiveState": "inactive", "ActiveEnterTimestamp": "",
                              "InactiveEnterTimestamp": ""}


def test_start_then_stop_are_stamped_in_systemd_format(tmp_path):
    setup(tmp_path)
    assert run(tmp_path, "start", "gdm.service").returncode == 0
    started = show(tmp_path)
    assert started["ActiveState"] == "active" and re.fullmatch(r"\w{3} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC",
                                                               started["ActiveEnterTimestamp"])
    assert started["InactiveEnterTimestamp"] == ""
    run(tmp_path, "stop", "display-manager.service")       # an alias stamps the unit it names
    stopped = show(tmp_path, "display-manager")
    assert stopped["ActiveState"] == "inactive" and stopped["InactiveEnterTimestamp"]
    assert stopped["ActiveEnterTimestamp"] == started["ActiveEnterTimestamp"]


def test_a_stop_of_a_stopped_unit_stamps_nothing(tmp_path):
    setup(tmp_path)
    run(tmp_path, "stop", "gdm.service")
    assert show(tmp_path)["InactiveEnterTimestamp"] == ""


def test_other_calls_are_the_replacement_s_own(tmp_path):
    setup(tmp_path)
    run(tmp_path, "start", "gdm.service")
    out = run(tmp_path, "is-active", "gdm.service")
    assert (out.returncode, out.stdout) == (0, "active\n")
