"""module_utils/docker_info.py: what playbooks/node_updates.yml and playbooks/rollback.yml take from
community.docker.docker_container_info and docker_image_info (shapes as community.docker 4.8.5 returns them on the
testbed's dockerd)."""
from __future__ import annotations

from ansible.module_utils.docker_info import any_running, container_status, image_present

RUNNING = {"changed": False, "exists": True, "container": {
    "Name": "/dsv41-worker", "Config": {"Env": ["HF_TOKEN=hf_secret"]},
    "State": {"Status": "running", "Running": True, "Paused": False, "ExitCode": 0}}}
EXITED = {"changed": False, "exists": True, "container": {"State": {"Status": "exited", "Running": False}}}
PAUSED = {"changed": False, "exists": True, "container": {"State": {"Status": "paused", "Running": True}}}
MISSING = {"changed": False, "exists": False, "container": None}
FAILED = {"failed": True, "msg": "Error connecting: Error while fetching server API version"}
ID = "sha256:" + "a" * 64


def test_the_state_of_a_container_or_none():
    assert [container_status(r) for r in (RUNNING, EXITED, PAUSED, MISSING, FAILED, None)] == \
        ["running", "exited", "paused", None, None, None]


def test_a_rank_served_when_one_of_its_engine_containers_runs():
    assert any_running([MISSING, RUNNING]) is True
    # A paused engine does not serve; a daemon that did not answer is not serving either (the old CLI read's rule).
    assert any_running([MISSING, PAUSED]) is False and any_running([FAILED, EXITED]) is False
    assert any_running([]) is False and any_running(None) is False


def test_the_recorded_image_must_be_there_with_exactly_its_id():
    assert image_present({"images": [{"Id": ID, "RepoTags": ["dsv41-3x-spark:local"]}]}, ID) is True
    assert image_present({"images": []}, ID) is False
    assert image_present({"images": [{"Id": "sha256:" + "b" * 64}]}, ID) is False
    assert image_present(FAILED, ID) is False and image_present(None, ID) is False
