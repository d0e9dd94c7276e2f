"""testinfra hosts of the scenario's testbed, over the SSH config that `testbed/fleet up` writes."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import testinfra

HOSTS = ("spark1", "spark2", "spark3")


def state_dir() -> Path:
    explicit = os.environ.get("SPARKFLEET_TESTBED_STATE")
    if explicit:
        return Path(explicit)
    project = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY") or Path(__file__).resolve().parents[3])
    testbed_id = os.environ.get("SPARKFLEET_TESTBED_ID", "0") or "0"
    return project / (".testbed" if testbed_id == "0" else f".testbed-{testbed_id}")


@pytest.fixture(scope="session")
def node():
    config = state_dir() / "ssh" / "config"
    if not config.exists():
        pytest.fail(f"no testbed SSH config at {config}: is the testbed up (molecule create)?")
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = testinfra.get_host(f"ssh://{name}", ssh_config=str(config))
        return cache[name]
    return get
