"""docs: node_updates.yml as written leaves a serving fleet serving (issue 20 item 5)."""
from __future__ import annotations

import pytest

from tests.journeys.conftest import sh

pytestmark = pytest.mark.usefixtures("seed_testbed")
RANKS = {"spark1": "dsv41-head", "spark2": "dsv41-worker", "spark3": "dsv41-worker"}


def running(host, name: str) -> bool:
    return host.run(f"docker inspect -f '{{{{.State.Running}}}}' {name}").stdout.strip() == "true"


def test_node_updates_leaves_the_fleet_serving(host):
    boot = sh("ansible-playbook playbooks/engine.yml")
    assert boot.returncode == 0, boot.stdout[-3000:]
    assert all(running(host(h), c) for h, c in RANKS.items())
    run = sh("ansible-playbook playbooks/node_updates.yml")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "engine serving again on every rank" in run.stdout
    assert [h for h, c in RANKS.items() if not running(host(h), c)] == []
