"""README's pack, then docs' engram_aside journey: aside (no label), restore, purge refused, purge confirmed."""
from __future__ import annotations

import re

import pytest

from tests.journeys.conftest import sh

pytestmark = pytest.mark.usefixtures("seed_testbed")
DIRS = {"spark1": "/home/mia/dsv41-engram", "spark2": "/home/zurih/dsv41-3x-spark/engram",
        "spark3": "/home/zurih/dsv41-3x-spark/engram"}
STATE: dict = {}


def shards(host, path: str) -> list[str]:
    out = host.run(f"ls -1 {path}")
    return sorted(n for n in out.stdout.split() if re.fullmatch(r"engram-l\d+-r\d+of\d+\.bin", n))


def test_pack_as_readme_says(host):
    run = sh("ansible-playbook playbooks/pack_engram.yml -e engram_relocate_stale=true "
             "-e engram_relocate_remove_source=true -e engram_restart_engine=true")
    assert run.returncode == 0, run.stdout[-3000:]
    for name, path in DIRS.items():
        STATE[name] = shards(host(name), path)
        assert STATE[name], f"{name}: no packed shard in {path}"


def test_aside_without_label_moves_every_shard_under_one_label(host):
    run = sh("ansible-playbook playbooks/engram_aside.yml")
    assert run.returncode == 0, run.stdout[-3000:]
    labels = set(re.findall(r"engram_aside_restore=(\d{8}T\d{6}Z)", run.stdout))
    assert len(labels) == 1, run.stdout[-3000:]
    STATE["label"] = labels.pop()
    assert "WARNING" in run.stdout and "engram_aside_purge_confirm=true" in run.stdout
    for name, path in DIRS.items():
        assert shards(host(name), path) == []
        assert shards(host(name), f"{path}/.sparkfleet-aside/{STATE['label']}") == STATE[name]


def test_restore_puts_them_back():
    run = sh(f"ansible-playbook playbooks/engram_aside.yml -e engram_aside_restore={STATE['label']}")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "moved back" in run.stdout


def test_restored_shards_are_in_place(host):
    for name, path in DIRS.items():
        assert shards(host(name), path) == STATE[name]
        assert not host(name).file(f"{path}/.sparkfleet-aside/{STATE['label']}").exists
    again = sh("ansible-playbook playbooks/engram_aside.yml -e engram_aside_label=again")
    assert again.returncode == 0, again.stdout[-3000:]


def test_purge_needs_confirmation_then_deletes(host):
    refused = sh("ansible-playbook playbooks/engram_aside.yml -e engram_aside_purge=again")
    assert refused.returncode != 0
    assert "nothing was deleted" in refused.stdout and "engram_aside_purge_confirm=true" in refused.stdout
    for name, path in DIRS.items():
        assert shards(host(name), f"{path}/.sparkfleet-aside/again") == STATE[name]
    done = sh("ansible-playbook playbooks/engram_aside.yml -e engram_aside_purge=again -e engram_aside_purge_confirm=true")
    assert done.returncode == 0, done.stdout[-3000:]
    for name, path in DIRS.items():
        assert not host(name).file(f"{path}/.sparkfleet-aside/again").exists
    assert "WARNING" not in done.stdout
