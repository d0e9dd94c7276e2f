"""Operator journeys: the commands of README.md and docs/*.md run exactly as written, with the shell,
on the seed testbed, in the order an operator would. `make journeys` runs them (`make test` too).

`sh(command)` runs one documented command line from the repository root with the venv first on PATH and
this session's SPARKFLEET_TESTBED_ID, and returns the CompletedProcess (stdout and stderr together)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import ensure_testbed, host, state_dir  # noqa: F401  (host: a fixture)

ROOT = Path(__file__).resolve().parents[2]
INCUMBENT = ROOT / "inventory" / "testbed" / "group_vars" / "all" / "incumbent.yml"


def sh(command: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
    env["SPARKFLEET_TESTBED_STATE"] = str(state_dir())
    env.setdefault("SPARKFLEET_RUNS_DIR", str(ROOT / "runs" / f"testbed-{os.environ.get('SPARKFLEET_TESTBED_ID') or '0'}"))
    os.makedirs(env["SPARKFLEET_RUNS_DIR"], exist_ok=True)
    return subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, text=True, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/journeys" in str(item.fspath):
            item.add_marker(pytest.mark.journey)
            item.add_marker(pytest.mark.testbed)


@pytest.fixture(scope="module")
def seed_testbed():
    if os.geteuid() != 0:
        pytest.skip("the testbed needs root")
    ensure_testbed(fresh=True)
    yield


@pytest.fixture(scope="module")
def incumbent_left_as_found():
    """The journey's rollouts write the testbed's incumbent file (the operator's kept configuration): start
    from none, put back what was there at the end."""
    before = INCUMBENT.read_text() if INCUMBENT.exists() else None
    INCUMBENT.unlink(missing_ok=True)
    yield
    if before is None:
        INCUMBENT.unlink(missing_ok=True)
    else:
        INCUMBENT.write_text(before)
