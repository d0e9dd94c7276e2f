"""library/fleet_snapshot_info (and its deprecated alias fleet_snapshot) and module_utils/fleet_snapshot: one
read-only snapshot per host, with the host's files replaced by fixtures and its commands (nvidia-smi, docker, systemctl) by a table of canned answers."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from unittest import mock

import pytest

from ansible.module_utils import basic
from ansible.module_utils import fleet_snapshot as fs
from tests.conftest import load_module
from tests.unit.module_harness import run_module

MODULE = load_module("fleet_snapshot_info")
ALIAS = load_module("fleet_snapshot")

MEMINFO = """MemTotal:       127587400 kB
MemFree:        120900000 kB
MemAvailable:   122700000 kB
Cached:          1702400 kB
CmaTotal:              0 kB
CmaFree:               0 kB
HugePages_Total:       0
"""
PRESSURE = """some avg10=1.50 avg60=0.75 avg300=0.10 total=123456
full avg10=0.00 avg60=0.00 avg300=0.00 total=42
"""
QUERY = "0, NVIDIA GB10, 580.159.03, 208, 3003\n"
CLOCK_LOCKED = """
==============NVSMI LOG==============

Driver Version                            : 580.159.03

GPU 00000000:01:00.0
    Clocks
        Graphics                          : 208 MHz
        SM                                : 208 MHz
        Memory                            : N/A
    Max Clocks
        SM                                : 3003 MHz
    Locked Clocks
        Min                               : 0 MHz
        Max                               : 2200 MHz
"""
CLOCK_FREE = CLOCK_LOCKED.replace(": 0 MHz", ": N/A").replace(": 2200 MHz", ": N/A")


def container(name: str, image: str, state: str, image_id: str = "sha256:aaa", labels: dict | None = None,
              env: list | None = None) -> dict:
    return {"Id": hashlib.sha256(name.encode()).hexdigest(), "Name": "/" + name, "Image": image_id,
            "State": {"Status": state, "StartedAt": "2026-11-29T10:00:00Z"},
            "Config": {"Image": image, "Labels": labels or {}, "Env": env or []},
            "HostConfig": {"RestartPolicy": {"Name": "unless-stopped"}},
            "Mounts": [{"Source": "/home/zurih/dsv41-3x-spark/engram", "Destination": "/engram", "RW": True}]}


CONTAINERS = [
    container("grafana", "grafana/grafana:11.2.0", "paused", labels={"owner": "zurih", "com.docker.compose.project": "homelab"}),
    container("dsv41-worker", "dsv41-3x-spark:local", "running", image_id="sha256:fleet",
              env=["NODE_RANK=2", "TP_SIZE=3", "EXTRA=a=b"]),
    container("canary", "someone/else:1", "running", image_id="sha256:fleet"),
]


class Host:
    """Canned answers for the commands the snapshot runs; records every call."""

    def __init__(self, answers: dict | None = None):
        self.answers = {
            ("nvidia-smi", "--query-gpu=" + ",".join(fs.QUERY_FIELDS), "--format=csv,noheader,nounits"): (0, QUERY, ""),
            ("nvidia-smi", "-q", "-d", "CLOCK"): (0, CLOCK_LOCKED, ""),
            ("docker", "ps", "-a", "-q", "--no-trunc"): (0, "\n".join(c["Id"] for c in CONTAINERS) + "\n", ""),
            ("docker", "inspect", "--type", "container", *[c["Id"] for c in CONTAINERS]): (0, json.dumps(CONTAINERS), ""),
            ("docker", "image", "inspect", "--format", "{{.Id}}", "dsv41-3x-spark:local"): (0, "sha256:fleet\n", ""),
            ("systemctl", "is-active", "gdm.service"): (0, "active\n", ""),
            ("systemctl", "is-enabled", "gdm.service"): (0, "static\n", ""),
            ("systemctl", "is-enabled", "nvidia-clock-lock.service"): (0, "enabled\n", ""),
            ("systemctl", "is-active", "nvidia-clock-lock.service"): (0, "active\n", ""),
            ("systemctl", "is-enabled", "nope.service"): (1, "", "ERROR:systemctl:Unit nope.service not found.\n"),
            ("systemctl", "is-active", "nope.service"): (3, "inactive\n", ""),
            ("systemctl", "get-default"): (0, "multi-user.target\n", ""),
        }
        self.answers.update(answers or {})
        self.calls = []

    def __call__(self, argv):
        argv = tuple(argv)
        self.calls.append(argv)
        answer = self.answers.get(argv)
        if answer is None:
            raise AssertionError(f"unexpected command {argv}")
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def paths(tmp_path):
    (tmp_path / "meminfo").write_text(MEMINFO)
    (tmp_path / "pressure").write_text(PRESSURE)
    (tmp_path / "loadavg").write_text("0.52 0.41 0.30 2/412 12345\n")
    units = tmp_path / "units"
    units.mkdir()
    os.symlink("/lib/systemd/system/graphical.target", units / "default.target")
    os.symlink("/etc/systemd/system/gdm.service", units / "display-manager.service")
    return fs.Paths(meminfo=str(tmp_path / "meminfo"), pressure_memory=str(tmp_path / "pressure"),
                    loadavg=str(tmp_path / "loadavg"), unit_dir=str(units),
                    nvidia_drm_parameters=str(tmp_path / "no-nvidia-drm"))


def snap(host: Host, paths: fs.Paths, **request) -> dict:
    return fs.take(host, fs.Request(**request), paths)


def test_memory_reads_meminfo_and_pressure(paths):
    out = snap(Host(), paths, sections=("memory",))
    assert out["memory"] == {
        "mem_total_kb": 127587400, "mem_free_kb": 120900000, "mem_available_kb": 122700000, "cached_kb": 1702400,
        "cma_total_kb": 0, "cma_free_kb": 0, "cma_free_exceeds_total": False,
        "pressure": {"some": {"avg10": 1.5, "avg60": 0.75, "avg300": 0.1, "total": 123456},
                     "full": {"avg10": 0.0, "avg60": 0.0, "avg300": 0.0, "total": 42}}}
    assert out["errors"] == {} and "gpu" not in out


def test_memory_flags_the_kexec_handover_cma_tell_and_survives_without_psi(paths, tmp_path):
    (tmp_path / "meminfo").write_text(MEMINFO.replace("CmaFree:               0", "CmaFree:         9437184"))
    out = snap(Host(), replace(paths, pressure_memory=str(tmp_path / "absent")), sections=("memory",))
    assert out["memory"]["cma_free_exceeds_total"] is True
    assert out["memory"]["pressure"] is None


def test_load(paths):
    out = snap(Host(), paths, sections=("load",))
    assert out["load"] == {"load1": 0.52, "load5": 0.41, "load15": 0.3, "runnable": 2, "processes": 412,
                           "cpus": os.cpu_count()}


def test_gpu_clocks_driver_and_lock(paths):
    out = snap(Host(), paths, sections=("gpu",))
    gpu = out["gpu"]
    assert (gpu["name"], gpu["driver"], gpu["sm_mhz"], gpu["max_sm_mhz"]) == ("NVIDIA GB10", "580.159.03", 208, 3003)
    assert gpu["locked"] == {"min_mhz": 0, "max_mhz": 2200}
    assert gpu["gpus"][0]["bus_id"] == "00000000:01:00.0" and gpu["count"] == 1


def test_gpu_without_a_lock_reports_none(paths):
    host = Host({("nvidia-smi", "-q", "-d", "CLOCK"): (0, CLOCK_FREE, "")})
    assert snap(host, paths, sections=("gpu",))["gpu"]["locked"] is None


def test_parse_clock_query_keeps_gpus_apart():
    second = CLOCK_LOCKED.split("GPU ", 1)[1].replace("00000000:01:00.0", "00000000:02:00.0").replace(": 2200", ": 1800")
    parsed = fs.parse_clock_query(CLOCK_LOCKED + "\nGPU " + second)
    assert [(g["bus_id"], g["locked_max"]) for g in parsed["gpus"]] == [("00000000:01:00.0", 2200),
                                                                       ("00000000:02:00.0", 1800)]


@pytest.mark.parametrize("answer, needle", [
    (FileNotFoundError(2, "No such file or directory"), "cannot run nvidia-smi"),
    ((9, "", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"), "exited 9"),
    ((0, "", ""), "listed no GPU"),
])
def test_gpu_failure_is_recorded_not_raised(paths, answer, needle):
    host = Host({("nvidia-smi", "--query-gpu=" + ",".join(fs.QUERY_FIELDS), "--format=csv,noheader,nounits"): answer})
    out = snap(host, paths, sections=("gpu", "load"))
    assert out["gpu"] is None and needle in out["errors"]["gpu"]
    assert out["load"]["load1"] == 0.52


def test_boot_reads_the_default_target_link_and_the_display_manager(paths):
    out = snap(Host(), paths, sections=("boot",))
    assert out["boot"] == {"default_target": "graphical.target", "default_target_source": "link",
                           "display_manager": {"unit": "gdm.service", "active": "active"}, "nvidia_drm": None}


def test_boot_falls_back_to_systemctl_and_reads_nvidia_drm(paths, tmp_path):
    os.unlink(os.path.join(paths.unit_dir, "default.target"))
    os.unlink(os.path.join(paths.unit_dir, "display-manager.service"))
    drm = tmp_path / "nvidia_drm"
    drm.mkdir()
    (drm / "modeset").write_text("Y\n")
    (drm / "fbdev").write_text("N\n")
    out = snap(Host(), replace(paths, nvidia_drm_parameters=str(drm)), sections=("boot",))
    assert out["boot"] == {"default_target": "multi-user.target", "default_target_source": "systemctl",
                           "display_manager": None, "nvidia_drm": {"modeset": "Y", "fbdev": "N"}}


def test_containers_and_serving(paths):
    out = snap(Host(), paths, sections=("containers", "serving"), serving_image="dsv41-3x-spark:local")
    rows = {r["name"]: r for r in out["containers"]}
    assert [r["name"] for r in out["containers"]] == ["canary", "dsv41-worker", "grafana"]
    assert rows["grafana"] == {"name": "grafana", "id": CONTAINERS[0]["Id"][:12], "image": "grafana/grafana:11.2.0",
                               "image_id": "sha256:aaa", "state": "paused",
                               "labels": {"owner": "zurih", "com.docker.compose.project": "homelab"},
                               "owner": "zurih", "restart_policy": "unless-stopped", "serving": False}
    # By name, and by image id even under another tag.
    assert rows["dsv41-worker"]["serving"] and rows["canary"]["serving"]
    serving = out["serving"]
    assert serving["image_id"] == "sha256:fleet"
    worker = [c for c in serving["containers"] if c["name"] == "dsv41-worker"][0]
    assert worker["env"] == {"NODE_RANK": "2", "TP_SIZE": "3", "EXTRA": "a=b"}
    assert worker["mounts"] == [{"source": "/home/zurih/dsv41-3x-spark/engram", "destination": "/engram", "rw": True}]


def test_serving_names_come_from_the_caller_only(paths):
    # No built-in names: the playbooks pass the inventory's fleet_head_container / fleet_worker_container.
    unnamed = {r["name"]: r["serving"] for r in snap(Host(), paths, sections=("containers",))["containers"]}
    assert unnamed == {"canary": False, "dsv41-worker": False, "grafana": False}
    named = {r["name"]: r["serving"] for r in
             snap(Host(), paths, sections=("containers",), serving_names=("grafana",))["containers"]}
    assert named == {"canary": False, "dsv41-worker": False, "grafana": True}


def test_no_containers_means_no_inspect(paths):
    host = Host({("docker", "ps", "-a", "-q", "--no-trunc"): (0, "", "")})
    out = snap(host, paths, sections=("containers",))
    assert out["containers"] == [] and not any(c[:2] == ("docker", "inspect") for c in host.calls)


def test_docker_missing_is_recorded_for_both_sections(paths):
    host = Host({("docker", "ps", "-a", "-q", "--no-trunc"): FileNotFoundError(2, "No such file")})
    out = snap(host, paths, sections=("containers", "serving"))
    assert out["containers"] is None and out["serving"] is None
    assert set(out["errors"]) == {"containers", "serving"}


def test_disks_measure_the_nearest_existing_parent(paths, tmp_path):
    out = snap(Host(), paths, sections=("disks",), volumes=(("archive", str(tmp_path / "not" / "yet")),
                                                           ("engram", str(tmp_path))))
    archive, engram = out["disks"]["archive"], out["disks"]["engram"]
    assert archive["exists"] is False and archive["measured_path"] == str(tmp_path)
    assert engram["exists"] is True and engram["total_bytes"] > 0
    assert 0 <= engram["available_bytes"] <= engram["free_bytes"] <= engram["total_bytes"]


def test_files_hash_describe_and_keep_small_text(paths, tmp_path):
    unit = tmp_path / "unit.service"
    unit.write_text("[Service]\nExecStart=/usr/bin/nvidia-smi -lgc 0,2200\n")
    os.chmod(unit, 0o644)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 100)
    binary = tmp_path / "bin"
    binary.write_bytes(b"\xff\xfe\x00")
    link = tmp_path / "link"
    os.symlink("/lib/systemd/system/multi-user.target", link)
    files = tuple(str(p) for p in (unit, big, binary, link, tmp_path / "missing"))
    out = snap(Host(), paths, sections=("files",), files=files, content_max_bytes=64)["files"]
    assert out[str(unit)] == {"exists": True, "type": "file", "mode": "0644", "size": unit.stat().st_size,
                              "sha256": hashlib.sha256(unit.read_bytes()).hexdigest(), "content": unit.read_text()}
    assert out[str(big)]["sha256"] == hashlib.sha256(b"x" * 100).hexdigest() and "content" not in out[str(big)]
    assert out[str(binary)]["content"] is None
    assert out[str(link)]["type"] == "link" and out[str(link)]["link_target"] == "/lib/systemd/system/multi-user.target"
    assert out[str(tmp_path / "missing")] == {"exists": False}


def test_units(paths):
    out = snap(Host(), paths, sections=("units",), units=("nvidia-clock-lock.service", "nope.service"))
    assert out["units"] == {"nvidia-clock-lock.service": {"enabled": "enabled", "active": "active"},
                            "nope.service": {"enabled": "not-found", "active": "inactive"}}


def test_sections_from():
    assert fs.sections_from(["all"]) == fs.SECTIONS
    assert fs.sections_from(["units", "gpu"]) == ("gpu", "units")


# ------------------------------------------------------------------ the module


@pytest.fixture
def module_host(paths, monkeypatch):
    host = Host()
    monkeypatch.setattr(fs, "DEFAULT_PATHS", paths)

    def run_command(self, argv, **kwargs):
        return host(argv)
    with mock.patch.object(basic.AnsibleModule, "run_command", run_command):
        yield host


def test_module_takes_the_sections_asked_for(module_host):
    out = run_module(MODULE, {"gather": ["gpu", "units"], "units": ["nvidia-clock-lock.service"]})
    assert not out.failed, out.result
    snapshot = out.result["snapshot"]
    assert out.result["changed"] is False
    assert snapshot["sections"] == ["gpu", "units"]
    assert snapshot["gpu"]["locked"] == {"min_mhz": 0, "max_mhz": 2200}
    assert "memory" not in snapshot and "containers" not in snapshot


def test_module_check_mode_returns_the_same_and_runs_only_reads(module_host):
    args = {"serving_image": "dsv41-3x-spark:local", "units": ["gdm.service"]}
    normal = run_module(MODULE, args).result
    checked = run_module(MODULE, args, check_mode=True).result
    for result in (normal, checked):
        result["snapshot"].pop("taken_at")
    assert checked == normal and checked["changed"] is False
    assert {c[1] for c in module_host.calls if c[0] == "docker"} <= {"ps", "inspect", "image"}
    assert not any(c[0] == "nvidia-smi" and ("-lgc" in c or "-rgc" in c) for c in module_host.calls)


@pytest.mark.parametrize("args, needle", [
    ({"volumes": {"engram": "relative/path"}}, "absolute paths; not absolute: engram"),
    ({"content_max_bytes": -1}, "0 or more"),
    ({"gather": ["everything"]}, "value of gather must be one or more of"),
])
def test_module_rejects_bad_options(module_host, args, needle):
    out = run_module(MODULE, args)
    assert out.failed and needle in out.result["msg"]
    assert module_host.calls == []


def test_serving_env_secrets_are_masked_everywhere_in_the_snapshot(paths, tmp_path):
    # issue 19 item 13: secret-looking keys, listed keys and URL credentials never leave the host.
    env = ["NODE_RANK=2", "HF_TOKEN=hf_live_abcd", "DB_PASSWORD=pw", "MY_CRED=cred_xyz1",
           "MODEL_URL=https://alice:s3cr3t@hub.example/m", "EXTRA=a=b"]
    raw = [container("dsv41-worker", "dsv41-3x-spark:local", "running", image_id="sha256:fleet", env=env)]
    env_file = tmp_path / "sparkfleet.env"
    env_file.write_text("HF_TOKEN=hf_live_abcd\nA=1\n")
    host = Host({("docker", "ps", "-a", "-q", "--no-trunc"): (0, raw[0]["Id"] + "\n", ""),
                 ("docker", "inspect", "--type", "container", raw[0]["Id"]): (0, json.dumps(raw), "")})
    out = snap(host, paths, sections=("serving", "files"), serving_image="dsv41-3x-spark:local",
               files=(str(env_file),), secret_env_keys=("MY_CRED",))
    assert out["serving"]["containers"][0]["env"] == {
        "NODE_RANK": "2", "HF_TOKEN": "********", "DB_PASSWORD": "********", "MY_CRED": "********",
        "MODEL_URL": "https://hub.example/m", "EXTRA": "a=b"}
    text = json.dumps(out)
    for secret in ("hf_live_abcd", "cred_xyz1", "s3cr3t", '"pw"'):
        assert secret not in text
    assert out["files"][str(env_file)]["content"] == "HF_TOKEN=********\nA=1\n"


def test_the_deprecated_alias_returns_the_same_and_warns(module_host, monkeypatch):
    deprecations = []
    monkeypatch.setattr(basic.AnsibleModule, "deprecate",
                        lambda self, msg, version=None, **kw: deprecations.append((msg, version)))
    args = {"gather": ["gpu", "units"], "units": ["nvidia-clock-lock.service"]}
    new = run_module(MODULE, args).result
    assert deprecations == []
    old = run_module(ALIAS, args).result
    for result in (new, old):
        result["snapshot"].pop("taken_at")
    assert old == new
    assert deprecations == [("fleet_snapshot is now called fleet_snapshot_info (a read-only module returns no "
                             "ansible_facts); replace the module name, the options and results are the same.", "2.0.0")]
