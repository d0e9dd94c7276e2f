"""README: status.yml on the seed testbed shows the right values and changes nothing (issue 20 item 11)."""
from __future__ import annotations

import re

import pytest

from tests.journeys.conftest import sh

pytestmark = pytest.mark.usefixtures("seed_testbed")


def test_status_shows_the_seed_fleet_and_changes_nothing(host):
    before = {h: host(h).run("docker ps -a --format '{{.Names}} {{.State}}'; ls -laR --time-style=+%s /home").stdout
              for h in ("spark1", "spark2", "spark3")}
    run = sh("ansible-playbook playbooks/status.yml")
    assert run.returncode == 0, run.stdout[-3000:]
    assert re.findall(r"changed=(\d+)", run.stdout) and set(re.findall(r"changed=(\d+)", run.stdout)) == {"0"}
    lines = dict(re.findall(r'"(spark\d|fleet): ([^"]*)"', run.stdout))
    assert set(lines) == {"spark1", "spark2", "spark3", "fleet"}, run.stdout[-2000:]
    for h in ("spark1", "spark2", "spark3"):
        serving = "running" in host(h).run("docker ps --filter name=^dsv41- --format '{{.State}}'").stdout
        assert lines[h].startswith("serving" if serving else "NOT serving"), lines[h]
        assert "image dsv41-3x-spark:local" in lines[h] and "packed l1=" in lines[h] and "l14=" in lines[h]
        assert "clocks " in lines[h] and "drift " in lines[h]
    assert re.match(r"\d/3 ranks serving", lines["fleet"]) and "last run " in lines["fleet"]
    after = {h: host(h).run("docker ps -a --format '{{.Names}} {{.State}}'; ls -laR --time-style=+%s /home").stdout
             for h in ("spark1", "spark2", "spark3")}
    assert after == before
