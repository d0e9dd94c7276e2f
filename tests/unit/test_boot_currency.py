"""module_utils/boot_currency.py: a rollout refuses when the host changed since the running engine booted
(the boot's KV pool, the memory ledger's reference, no longer matches what a new boot would get)."""
from __future__ import annotations

import pytest

from ansible.module_utils.boot_currency import changes_since_boot, parse_time, refusal

BOOT = "2026-12-02T06:10:07.253513Z"


def container(name, started, finished="0001-01-01T00:00:00Z", running=True):
    return {"Name": "/" + name, "State": {"Running": running, "StartedAt": started, "FinishedAt": finished}}


ENGINE = container("dsv41-worker", BOOT)


def display(state="inactive", active="Wed 2026-12-02 06:08:50 UTC", inactive=""):
    return {"unit": "gdm.service", "ActiveState": state, "ActiveEnterTimestamp": active,
            "InactiveEnterTimestamp": inactive}


def test_times_in_the_formats_hosts_print():
    assert parse_time("2026-12-02T06:10:07.253513Z") == pytest.approx(1796191807.253513)
    # real docker prints nanoseconds; systemd (TZ=UTC) its weekday format; systemctl --timestamp=unix an epoch
    assert parse_time("2026-12-02T06:10:07.253513123Z") == pytest.approx(1796191807.253513)
    assert parse_time("Wed 2026-12-02 06:10:07 UTC") == 1796191807
    assert parse_time("@1796191807") == 1796191807
    for never in ("", "n/a", "0001-01-01T00:00:00Z", None):
        assert parse_time(never) is None


def test_a_host_unchanged_since_the_boot_is_current():
    out = changes_since_boot(ENGINE, [ENGINE, container("grafana", "2026-12-02T06:09:00Z")],
                             display("inactive", inactive="Wed 2026-12-02 06:09:33 UTC"),
                             {"path": "/var/lib/sparkfleet/quiesce.json", "exists": True, "mtime": 1796191779.6})
    assert out["current"] and out["changes"] == [], out


def test_the_display_manager_stopped_after_the_boot():
    # The journey's case: headless_stop_display_now after the engine booted (spark3's desktop held 0.35 GiB).
    out = changes_since_boot(ENGINE, [ENGINE], display("inactive", inactive="Wed 2026-12-02 06:12:00 UTC"), None)
    assert not out["current"]
    (change,) = out["changes"]
    assert change["what"] == "display" and "gdm.service stopped at 2026-12-02 06:12:00 UTC" in change["text"]


def test_the_display_manager_started_after_the_boot():
    out = changes_since_boot(ENGINE, [ENGINE], display("active", active="Wed 2026-12-02 06:20:00 UTC"), None)
    assert [c["what"] for c in out["changes"]] == ["display"] and "started" in out["changes"][0]["text"]


def test_a_display_manager_without_state_times_is_reported_unknown_not_current():
    out = changes_since_boot(ENGINE, [ENGINE], display("inactive", active="", inactive=""), None)
    assert out["changes"] == [] and out["unknown"] and out["current"]


def test_containers_started_or_stopped_after_the_boot():
    out = changes_since_boot(ENGINE, [
        ENGINE,
        container("jupyter-lab", "2026-12-02T06:15:00Z"),
        container("ollama", "2026-12-02T06:00:00Z", "2026-12-02T06:16:30.5Z", running=False),
        container("redis", "2026-12-02T06:00:00Z", "2026-12-02T06:05:00Z", running=False),
    ], None, None)
    texts = [c["text"] for c in out["changes"]]
    assert texts == ["container jupyter-lab started at 2026-12-02 06:15:00 UTC",
                     "container ollama stopped at 2026-12-02 06:16:30 UTC"], texts


def test_the_other_engine_container_and_its_own_restart_are_not_changes():
    head = container("dsv41-head", "2026-12-02T06:11:00Z")
    out = changes_since_boot(head, [head, container("dsv41-worker", "2026-12-02T06:10:30Z")], None, None)
    assert out["current"], out


def test_quiesce_applied_or_restored_after_the_boot():
    out = changes_since_boot(ENGINE, [ENGINE], None,
                             {"path": "/var/lib/sparkfleet/quiesce.json", "exists": True, "mtime": 1796191807.3 + 60})
    (change,) = out["changes"]
    assert change["what"] == "quiesce" and "/var/lib/sparkfleet/quiesce.json" in change["text"]


def test_an_engine_that_never_started_is_a_change_not_a_crash():
    out = changes_since_boot(container("dsv41-worker", "0001-01-01T00:00:00Z", running=False), [], None, None)
    assert not out["current"] and "no start time" in out["changes"][0]["text"]


def test_the_refusal_names_what_changed_and_the_command_to_run_first():
    out = changes_since_boot(ENGINE, [ENGINE], display("inactive", inactive="Wed 2026-12-02 06:12:00 UTC"), None)
    msg = refusal("spark3", 2, out)
    assert "spark3 (rank 2)" in msg and "gdm.service stopped" in msg and "booted at 2026-12-02 06:10:07 UTC" in msg
    assert "ansible-playbook playbooks/engine.yml -e engine_state=restarted" in msg
    assert "Nothing was changed" in msg


# The restore point's one shell call a rank (roles/rollout/tasks/restore_point.yml): host reads, the host marker,
# the containers' docker inspect, the log marker, the engine's log. These are the real commands' outputs.
HOST_MARKER, LOG_MARKER, QUIESCE = "--- sparkfleet: containers ---", "--- sparkfleet: engine log ---", "/var/lib/sparkfleet/quiesce.json"
INSPECT = '[{"Name": "/dsv41-worker", "State": {"Running": true, "StartedAt": "%s"}}]' % BOOT


def restore_read(host_lines):
    return "\n".join(host_lines + [HOST_MARKER, INSPECT, "", LOG_MARKER, "[2026-12-02 06:10:09] line one", "line two"])


def test_the_restore_points_one_call_is_split_into_display_quiesce_containers_and_log():
    from ansible.module_utils.boot_currency import split_restore_read
    out = split_restore_read(restore_read([
        "unit=gdm.service", "ActiveState=inactive", "ActiveEnterTimestamp=Wed 2026-12-02 06:08:50 UTC",
        "InactiveEnterTimestamp=Wed 2026-12-02 06:09:33 UTC", "quiesce_mtime=1796191779.600000000"]),
        0, HOST_MARKER, LOG_MARKER, QUIESCE)
    assert out["display"] == {"unit": "gdm.service", "ActiveState": "inactive",
                              "ActiveEnterTimestamp": "Wed 2026-12-02 06:08:50 UTC",
                              "InactiveEnterTimestamp": "Wed 2026-12-02 06:09:33 UTC"}
    assert out["quiesce"] == {"path": QUIESCE, "exists": True, "mtime": pytest.approx(1796191779.6)}
    assert out["log"] == "[2026-12-02 06:10:09] line one\nline two"
    import json
    assert json.loads(out["containers"])[0]["Name"] == "/dsv41-worker"
    # the same verdict as the three separate reads gave
    assert changes_since_boot(ENGINE, json.loads(out["containers"]), out["display"], out["quiesce"])["current"]


def test_no_display_manager_and_no_quiesce_record_read_as_before():
    from ansible.module_utils.boot_currency import split_restore_read
    out = split_restore_read(restore_read([]), 0, HOST_MARKER, LOG_MARKER, QUIESCE)
    assert out["display"] is None and out["quiesce"] == {"path": QUIESCE, "exists": False, "mtime": None}
    # a quiesce record written after the boot is still seen
    later = split_restore_read(restore_read(["quiesce_mtime=1796191900.5"]), 0, HOST_MARKER, LOG_MARKER, QUIESCE)
    out = changes_since_boot(ENGINE, [ENGINE], later["display"], later["quiesce"])
    assert not out["current"] and out["changes"][0]["what"] == "quiesce"


def test_a_failed_docker_read_gives_no_containers_and_a_failed_systemctl_is_not_current():
    from ansible.module_utils.boot_currency import split_restore_read
    out = split_restore_read("unit=gdm.service\nerror=systemctl show gdm.service failed (rc 1)\n" + HOST_MARKER
                             + "\nCannot connect to the Docker daemon", 1, HOST_MARKER, LOG_MARKER, QUIESCE)
    assert out["containers"] == "[]" and out["log"] == ""
    verdict = changes_since_boot(ENGINE, [ENGINE], out["display"], out["quiesce"])
    assert not verdict["current"]
    assert "the display manager's state could not be read (systemctl show gdm.service failed (rc 1))" in \
        refusal("spark2", 1, verdict)
