"""Verify the converged host tuning on the testbed: behaviour, not just that tasks ran."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HOSTS

UNIT = "/etc/systemd/system/nvidia-clock-lock.service"
MODPROBE = "/etc/modprobe.d/zz-nvidia-drm-override.conf"
HOMELAB = 19


def locked_range(node) -> tuple:
    text = node.check_output("nvidia-smi -q -d CLOCK")
    section = text.split("Locked Clocks", 1)[1]
    lo = re.search(r"Min\s*:\s*(\S+)", section).group(1)
    hi = re.search(r"Max\s*:\s*(\S+)", section).group(1)
    return lo, hi


@pytest.mark.parametrize("name", HOSTS)
def test_clock_lock_unit_is_the_managed_oneshot(node, name):
    unit = node(name).file(UNIT)
    assert unit.exists and unit.mode == 0o644 and unit.user == "root"
    lines = unit.content_string.splitlines()
    assert "# Ansible managed" in lines
    for line in ("Type=oneshot", "RemainAfterExit=yes", "ExecStart=/usr/bin/nvidia-smi -lgc 0,2200",
                 "WantedBy=multi-user.target"):
        assert line in lines, f"{name}: {line!r} missing from {UNIT}"


@pytest.mark.parametrize("name", HOSTS)
def test_clock_lock_unit_is_enabled_and_the_gpu_is_locked(node, name):
    host = node(name)
    assert host.service("nvidia-clock-lock.service").is_enabled
    assert host.check_output("systemctl is-active nvidia-clock-lock.service") == "active"
    assert locked_range(host) == ("0", "2200")
    # The stand-in's own state, not only its report.
    assert json.loads(host.file("/run/testbed/gpu.json").content_string)["locked"] == [0, 2200]


@pytest.mark.parametrize("name", HOSTS)
def test_headless_boot_setup(node, name):
    host = node(name)
    assert host.check_output("systemctl get-default") == "multi-user.target"
    override = host.file(MODPROBE)
    assert override.exists and override.mode == 0o644
    assert override.content_string.splitlines()[-1] == "options nvidia-drm modeset=1 fbdev=0"
    # The initramfs was rebuilt exactly once: by the converge, not by the idempotence or check runs.
    runs = host.file("/var/lib/testbed/update-initramfs.log").content_string.splitlines()
    assert [r.split(" ", 1)[1] for r in runs] == ["-u -k all"]


def test_spark3_desktop_keeps_running_until_a_reboot(node):
    # headless_stop_display_now is false: the converge sets the target and leaves gdm alone.
    assert node("spark3").service("gdm.service").is_running


def test_spark3_homelab_containers_are_paused_and_recorded(node):
    host = node("spark3")
    states = host.check_output("docker ps -a --filter label=com.docker.compose.project=homelab --format '{{.State}}'")
    assert states.split() == ["paused"] * HOMELAB
    record = json.loads(host.file("/var/lib/sparkfleet/quiesce.json").content_string)
    assert record["state"] == "quiet"
    assert sorted(a["name"] for a in record["actions"]) == sorted(
        host.check_output("docker ps -a --filter label=owner=zurih --format '{{.Names}}'").split())
    assert {(a["action"], a["from"]) for a in record["actions"]} == {("pause", "running")}


def test_nodes_without_dispensable_workloads_keep_no_record(node):
    for name in ("spark1", "spark2"):
        assert not node(name).file("/var/lib/sparkfleet/quiesce.json").exists


def test_dashboard_polls_every_ten_seconds(node):
    host = node("spark1")
    assert "POLL_MS=10000" in host.file("/etc/default/gpu-dashboard").content_string.splitlines()
    assert host.service("gpu-dashboard.service").is_running


def test_a_check_run_reports_no_change():
    """A converged fleet: `--check` of the converge must report changed=0 on every host."""
    ephemeral = os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY")
    scenario = os.environ.get("MOLECULE_SCENARIO_DIRECTORY") or str(Path(__file__).resolve().parents[1])
    if not ephemeral:
        pytest.skip("runs under molecule verify (needs its inventory)")
    playbook = Path(sys.executable).with_name("ansible-playbook")
    env = {k: v for k, v in os.environ.items() if k != "ANSIBLE_FORCE_COLOR"}
    env["ANSIBLE_NOCOLOR"] = "1"
    proc = subprocess.run([str(playbook), "--check", "-i", f"{ephemeral}/inventory", f"{scenario}/converge.yml"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    recap = dict(re.findall(r"^(spark\d)\s+:\s+ok=\d+\s+changed=(\d+)", proc.stdout, re.M))
    assert recap == {name: "0" for name in HOSTS}, proc.stdout[-3000:]
