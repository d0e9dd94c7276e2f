"""Host tuning (issue 4): clock_lock, headless, quiesce through playbooks/site.yml and playbooks/drift.yml on
the seed testbed. One fresh testbed for the module: the tests run in file order and each leaves the fleet
converged (or says what it changed) for the next."""
from __future__ import annotations

import json
import re

import pytest

from tests.integration.conftest import ensure_testbed, locked, run_playbook

pytestmark = pytest.mark.testbed

HOSTS = ("spark1", "spark2", "spark3")
UNIT = "/etc/systemd/system/nvidia-clock-lock.service"
MODPROBE = "/etc/modprobe.d/zz-nvidia-drm-override.conf"
RECORD = "/var/lib/sparkfleet/quiesce.json"
DASHBOARD = "/etc/default/gpu-dashboard"
HOMELAB = ["code-server", "comfyui", "filebrowser", "grafana", "jupyter-lab", "minio", "netdata", "nginx-proxy",
           "node-exporter", "ollama", "open-webui", "portainer", "postgres", "prometheus", "redis", "syncthing",
           "tensorboard", "uptime-kuma", "watchtower"]
# Everything host tuning manages, plus the state it acts on: equal before and after = nothing changed.
FINGERPRINT = ("for f in {unit} {modprobe} {record} {dashboard} /run/testbed/gpu.json "
               "/var/lib/testbed/update-initramfs.log; do printf '%s ' $f; sha256sum < $f 2>/dev/null || echo absent; "
               "done; readlink /etc/systemd/system/default.target; "
               "ls /etc/systemd/system/multi-user.target.wants; docker ps -a --format '{{{{.Names}}}} {{{{.State}}}}' | sort"
               ).format(unit=UNIT, modprobe=MODPROBE, record=RECORD, dashboard=DASHBOARD)


# The node preflight (another role, imported by validate_inventory.yml) judges the whole host; these tests
# judge host tuning alone, so they skip it (it would also stop on the states some tests set on purpose).
SKIP_PREFLIGHT = {"preflight_skip": True}


def site(extravars: dict | None = None, **kw):
    kw.setdefault("tags", "host_tuning")
    return run_playbook("site.yml", extravars={**SKIP_PREFLIGHT, **(extravars or {})}, **kw)


def drift(extravars: dict | None = None, **kw):
    """drift.yml with the host tuning roles only (other roles join drift_roles with their own items)."""
    extravars = {**SKIP_PREFLIGHT, "drift_roles": ["clock_lock", "headless", "quiesce"], **(extravars or {})}
    return run_playbook("drift.yml", extravars=extravars, **kw)


def fingerprint(host) -> dict:
    return {name: host(name).check_output(FINGERPRINT) for name in HOSTS}


def messages(run, task: str) -> dict:
    return {r["_host"]: r.get("msg", "") for r in run.results(task=task)}


def drift_rows(run) -> list:
    """(host, item) of every drifted row of the table drift.yml printed."""
    table = next(r["msg"] for r in run.results(task="Show the drift table"))
    rows, node = [], None
    for line in table:
        if line.startswith("== "):
            node = line[3:].split(":")[0]
        elif re.search(r"\s{2}YES\s{2}", line):
            rows.append((node, line.split("  ")[0].strip()))
    return rows


@pytest.fixture(scope="module")
def converged(host):
    """A fresh seed testbed, with redis paused by someone else, converged once."""
    ensure_testbed(fresh=True)
    host("spark3").check_output("docker pause redis")
    run = site()
    assert run.rc == 0, run.stdout[-4000:]
    return run


@pytest.fixture(scope="module")
def host():
    import testinfra
    from tests.integration.conftest import state_dir
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = testinfra.get_host(f"ssh://{name}", ssh_config=str(state_dir() / "ssh" / "config"))
        return cache[name]
    return get


def test_converge_sets_the_desired_state(converged, host):
    for name in HOSTS:
        h = host(name)
        unit = h.file(UNIT).content_string.splitlines()
        assert "ExecStart=/usr/bin/nvidia-smi -lgc 0,2200" in unit and "RemainAfterExit=yes" in unit
        assert h.service("nvidia-clock-lock.service").is_enabled and locked(host, name) == [0, 2200]
        assert h.check_output("systemctl get-default") == "multi-user.target"
        assert h.file(MODPROBE).content_string.splitlines()[-1] == "options nvidia-drm modeset=1 fbdev=0"
        assert len(h.file("/var/lib/testbed/update-initramfs.log").content_string.splitlines()) == 1
    states = dict(line.split() for line in host("spark3").check_output(
        "docker ps -a --format '{{.Names}} {{.State}}'").splitlines())
    assert states == {name: "paused" for name in HOMELAB}
    # redis was paused by hand before the converge: quiet already, so not recorded as quiesce's doing.
    record = json.loads(host("spark3").file(RECORD).content_string)
    assert sorted(a["name"] for a in record["actions"]) == sorted(set(HOMELAB) - {"redis"})
    assert "POLL_MS=10000" in host("spark1").file(DASHBOARD).content_string
    assert host("spark3").service("gdm.service").is_running  # headless_stop_display_now is false


def test_converge_says_reboot_required_without_rebooting(converged):
    headless = messages(converged, "Report whether a reboot is required")
    assert "REBOOT REQUIRED" in headless["spark3"] and "gdm.service is still running" in headless["spark3"]
    assert "graphical.target to multi-user.target" in headless["spark3"]
    summary = next(r["msg"] for r in converged.results(task="Show clocks, reboots and quieted workloads"))
    assert summary[0].startswith("REBOOT REQUIRED on") and "spark3" in summary[0]
    assert all(r["_event"] == "runner_on_skipped" for r in converged.results(task="Reboot to put"))
    clocks = messages(converged, "Report the GPU clocks before and after")
    assert "before locked 0-2200 MHz" in clocks["spark1"] and "after locked 0-2200 MHz" in clocks["spark1"]


def test_second_converge_changes_nothing(converged):
    run = site()
    assert run.rc == 0 and run.changed() == []


def test_check_on_a_drifted_fleet_shows_exactly_the_drift_and_changes_nothing(converged, host):
    host("spark3").check_output(f"sed -i 's/-lgc 0,2200/-lgc 0,1800/' {UNIT}")
    host("spark2").check_output("systemctl set-default graphical.target")
    host("spark3").check_output("docker unpause grafana")
    before = fingerprint(host)

    run = site(check=True, diff=True)

    assert run.rc == 0, run.stdout[-3000:]
    assert fingerprint(host) == before
    assert sorted(set(run.changed())) == sorted({
        ("spark3", "Install nvidia-clock-lock.service (locks the SM clocks at boot)"),
        ("spark3", "Apply clock limits"),
        ("spark2", "Set the default boot target to multi-user.target"),
        ("spark3", "Pause, stop or resume the dispensable workloads and record it"),
    })
    assert "-ExecStart=/usr/bin/nvidia-smi -lgc 0,1800" in run.stdout
    assert "+ExecStart=/usr/bin/nvidia-smi -lgc 0,2200" in run.stdout
    assert '-    "src": "/lib/systemd/system/graphical.target"' in run.stdout
    assert "-container grafana: running" in run.stdout and "+container grafana: paused" in run.stdout


def test_drift_report_names_the_three_items_and_fails(converged, host):
    before = fingerprint(host)
    run = drift({"drift_fail": True})
    assert run.rc != 0
    # The rows are the roles' own tasks that would change the host in check mode (issue 25 item 5).
    assert sorted(drift_rows(run)) == [("spark2", "headless Set the default boot target to multi-user.target"),
                                       ("spark3", "clock_lock Install nvidia-clock-lock.service (locks the SM clocks at boot)"),
                                       ("spark3", "quiesce Pause, stop or resume the dispensable workloads and record it")]
    failure = run.results(task="Fail when anything drifted")[0]
    assert failure["_event"] == "runner_on_failed" and "0,1800" in failure["msg"] and "grafana" in failure["msg"]
    # The roles ran in check mode: their "changed" is what would change (the rows above); the hosts are untouched.
    assert {h for h, _ in run.changed()} <= {"spark2", "spark3"}
    assert fingerprint(host) == before


def test_converge_repairs_the_drift(converged, host):
    run = site()
    assert run.rc == 0
    assert {h for h, _ in run.changed()} == {"spark2", "spark3"}
    assert "-lgc 0,2200" in host("spark3").file(UNIT).content_string
    assert host("spark2").check_output("systemctl get-default") == "multi-user.target"
    assert host("spark3").check_output("docker inspect -f '{{.State.Status}}' grafana") == "paused"
    clean = drift({"drift_fail": True})
    assert clean.rc == 0 and drift_rows(clean) == []


def test_a_gpu_that_lost_its_lock_is_locked_again(converged, host):
    host("spark1").check_output("nvidia-smi -rgc")
    check = site(check=True, limit="spark1", tags="clock_lock")
    assert check.changed() == [("spark1", "Re-apply the clock lock where the GPU lost it")]
    assert locked(host, "spark1") is None
    run = site(limit="spark1", tags="clock_lock")
    assert run.rc == 0 and locked(host, "spark1") == [0, 2200]


def test_restored_resumes_exactly_what_quiesce_paused(converged, host):
    restored = site(limit="spark3", tags="quiesce", extravars={"quiesce_state": "restored"})
    assert restored.rc == 0
    states = dict(line.split() for line in host("spark3").check_output(
        "docker ps -a --format '{{.Names}} {{.State}}'").splitlines())
    assert states == {**{name: "running" for name in HOMELAB}, "redis": "paused"}
    assert not host("spark3").file(RECORD).exists
    again = site(limit="spark3", tags="quiesce", extravars={"quiesce_state": "restored"})
    assert again.rc == 0 and again.changed() == []
    # Back to quiet; a listed name that does not exist here is a warning, not a failure.
    quiet = site(limit="spark3", tags="quiesce", extravars={"quiesce_dispensable": HOMELAB + ["jellyfin"]})
    assert quiet.rc == 0 and host("spark3").check_output("docker ps -q --filter status=running") == ""
    assert "quiesce_dispensable names jellyfin, which is neither a container nor a service here" in quiet.stdout


def test_clock_lock_unlocked_then_absent_then_locked(converged, host):
    h = host("spark2")
    unlocked = site(limit="spark2", tags="clock_lock", extravars={"clock_lock_state": "unlocked"})
    assert unlocked.rc == 0 and locked(host, "spark2") is None
    assert h.file(UNIT).exists and not h.service("nvidia-clock-lock.service").is_enabled
    absent = site(limit="spark2", tags="clock_lock", extravars={"clock_lock_state": "absent"})
    assert absent.rc == 0 and not h.file(UNIT).exists and locked(host, "spark2") is None
    relocked = site(limit="spark2", tags="clock_lock")
    assert relocked.rc == 0 and locked(host, "spark2") == [0, 2200] and h.service("nvidia-clock-lock.service").is_enabled


def test_desktop_and_back_rebuild_the_initramfs_each_time(converged, host):
    h = host("spark2")
    log = "/var/lib/testbed/update-initramfs.log"
    runs = len(h.file(log).content_string.splitlines())
    desktop = site(limit="spark2", tags="headless", extravars={"headless_state": "desktop"})
    assert desktop.rc == 0 and not h.file(MODPROBE).exists
    assert h.check_output("systemctl get-default") == "graphical.target"
    headless = site(limit="spark2", tags="headless")
    assert headless.rc == 0 and h.file(MODPROBE).exists
    assert h.check_output("systemctl get-default") == "multi-user.target"
    assert len(h.file(log).content_string.splitlines()) == runs + 2


def test_reboot_happens_only_when_allowed(converged, host):
    pid = host("spark3").check_output("cat /run/testbed/desktop.pid")
    run = site(check=True, limit="spark3", tags="headless", extravars={"headless_allow_reboot": True})
    assert run.rc == 0
    assert run.changed() == [("spark3", "Reboot to put the headless boot setup in effect")]
    assert "would reboot" in messages(run, "Report whether a reboot is required")["spark3"]
    assert host("spark3").check_output("cat /run/testbed/desktop.pid") == pid


def test_stop_display_now_stops_the_desktop(converged, host):
    run = site(limit="spark3", tags="headless", extravars={"headless_stop_display_now": True})
    try:
        assert run.rc == 0
        assert run.changed() == [("spark3", "Stop the display manager now")]
        assert not host("spark3").service("gdm.service").is_running
        assert "no reboot needed" in messages(run, "Report whether a reboot is required")["spark3"]
    finally:
        host("spark3").check_output("systemctl start gdm.service")


@pytest.mark.parametrize("extravars, needle", [
    ({"clock_lock_min_mhz": 1500, "clock_lock_max_mhz": 1000}, "clock_lock_max_mhz (1000) must be at least"),
    ({"clock_lock_max_mhz": "fast"}, "unable to convert to int"),
    ({"clock_lock_max_mhz": 2200.5}, "cannot be converted to an int"),
    ({"clock_lock_max_mhz": 3500}, "is above the maximum SM clock of this GPU (NVIDIA GB10): 3003 MHz"),
    ({"quiesce_dispensable": ["grafana", "dsv41-worker"]}, "names the serving container dsv41-worker"),
    ({"quiesce_gpu_poll_ms": 50}, "quiesce_gpu_poll_ms must be at least 100"),
    ({"headless_engram_drm_node": "/dev/dri/card0"}, "qualified only on driver 580.173.02 and this host runs driver 580.159.03"),
])
def test_bad_input_fails_before_any_host_changes(converged, host, extravars, needle):
    # One node is enough: the checks are the same on every node, and the run would otherwise change it
    # (the extra vars differ from its converged state).
    before = host("spark1").check_output(FINGERPRINT)
    run = site(extravars=extravars, limit="spark1")
    assert run.rc != 0
    failures = [r for r in run.results() if r["_event"] == "runner_on_failed"]
    assert failures and all(needle in (r.get("msg", "") + json.dumps(r.get("argument_errors", "")))
                            for r in failures), failures[:1]
    assert run.changed() == [] and host("spark1").check_output(FINGERPRINT) == before


def test_a_container_of_the_fleet_image_is_refused(converged, host):
    h = host("spark3")
    h.check_output("docker run -d --name canary --entrypoint sleep dsv41-3x-spark:local infinity")
    try:
        run = site(limit="spark3", extravars={"quiesce_dispensable": HOMELAB + ["canary"]})
        assert run.rc != 0 and run.changed() == []
        failure = [r for r in run.results() if r["_event"] == "runner_on_failed"][0]
        assert "canary (runs the fleet image dsv41-3x-spark:local)" in failure["msg"]
        assert h.check_output("docker inspect -f '{{.State.Status}}' canary") == "running"
    finally:
        h.check_output("docker rm -f canary")
