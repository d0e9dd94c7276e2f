"""testbed/engine/sim.py (issue 22): a simulated rank stops on `docker stop`'s SIGTERM as a serving engine does.

A container's entrypoint is PID 1 of its PID namespace, and the kernel drops every signal PID 1 has no handler for
(SIGKILL aside): without one, each `docker stop` of the engine on a real dockerd waited out the role's stop
timeout (30 s) and ended in SIGKILL (exit 137). Here the rank runs as PID 1 of a new PID namespace, as in a
container, and gets SIGTERM."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTBED = Path(__file__).resolve().parents[2] / "testbed"
# sim.main("run") with the boot itself replaced by a wait: what is checked is what main sets up around it.
RANK = (f"import sys, time; sys.path.insert(0, {str(TESTBED)!r}); from engine import sim\n"
        "def serve():\n    print('ready', flush=True)\n    time.sleep(120)\n    return 3\n"
        "sim.run = serve\nsys.exit(sim.main(['run']))\n")


def _pid_1_of(unshare_pid: int) -> int:
    """The forked child of `unshare --fork`: PID 1 of its new namespace."""
    for _ in range(500):
        children = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.01)
    raise AssertionError("unshare started no child")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a PID namespace needs root and unshare")
def test_a_rank_that_is_pid_1_stops_on_sigterm_and_says_so():
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", RANK],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, NODE_RANK="1"))
    try:
        assert proc.stdout.readline().strip() == "ready"
        os.kill(_pid_1_of(proc.pid), signal.SIGTERM)
        # A guard against a hang, not a timing check: without a handler PID 1 never sees the signal.
        out, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the rank ignored SIGTERM as PID 1 (docker stop would wait out its timeout, then SIGKILL)")
    assert proc.returncode == 0, out
    assert "TP1 EP1] Received SIGTERM: shutting down" in out
