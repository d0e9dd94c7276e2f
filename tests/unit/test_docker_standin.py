"""testbed/standins/docker.py: `docker stop` / `kill` / `pause` against the races of a real host.

A container is its init's process group: the init makes its own session and records its pid ("pid") and
its start time ("pidstart"); a shim records the exit code ("exitcode") once the init exits. Here the
"init" is a process this test starts in its own session, and the test plays the shim. Every case is one
a CI run can meet: the init exits while stop polls it (the flaky failure: /proc/<pid>/stat vanished
between its open and its read, and the CLI died with a traceback), an init that already exited, a pid
file that is stale, empty or not yet written, and a pid that a later, unrelated process now has.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "testbed" / "standins" / "docker.py"
# Tests replace os.killpg to see what stop signals; the clean-up needs the real one.
REAL_KILLPG = os.killpg

# An init stand-in: a process group of a leader and one child (like an engine and its worker). On
# SIGTERM the leader notes it in the folder given and, unless told to ignore it, exits with 143.
INIT = r"""
import os, signal, subprocess, sys, time
folder, ignore_term = sys.argv[1], sys.argv[2] == "ignore"
child = subprocess.Popen(["sleep", "300"])
open(os.path.join(folder, "child"), "w").write(str(child.pid))
def on_term(*_):
    open(os.path.join(folder, "got-term"), "w").close()
    if not ignore_term:
        child.terminate()
        os._exit(143)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(folder, "ready"), "w").close()
while True:
    time.sleep(0.05)
"""


@pytest.fixture
def docker(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("sparkfleet_docker_standin", DOCKER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "ROOT", str(tmp_path / "docker"))
    return mod


@pytest.fixture
def procs():
    """Every process a test starts, killed at the end whatever happened; an init stand-in with its group
    (its child outlives a leader that a test killed, and keeps the group, so the group id is still ours)."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if getattr(proc, "leads_group", False):
            try:
                REAL_KILLPG(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def make_container(docker, name: str, status: str = "running") -> Path:
    cid = (name.encode().hex() * 64)[:64]
    cdir = Path(docker.ROOT) / "containers" / cid
    cdir.mkdir(parents=True)
    config = {"Id": cid, "Name": "/" + name, "Created": "2026-11-30T00:00:00.000000Z",
              "LogPath": str(cdir / f"{cid}-json.log"), "Config": {"Labels": {}, "Image": "x"},
              "State": {"Status": status, "Running": status == "running", "Paused": False, "Pid": 0,
                        "ExitCode": 0, "StartedAt": "2026-11-30T00:00:00.000000Z",
                        "FinishedAt": "0001-01-01T00:00:00Z"}}
    (cdir / "config.v2.json").write_text(json.dumps(config))
    return cdir


def start_init(cdir: Path, procs: list, ignore_term: bool = False, record: bool = True) -> subprocess.Popen:
    """Start an init stand-in in its own session (as container_init.py does) and record it as the init does."""
    folder = cdir / "init"
    folder.mkdir()
    init = subprocess.Popen([sys.executable, "-c", INIT, str(folder), "ignore" if ignore_term else "exit"],
                            start_new_session=True)
    init.leads_group = True
    procs.append(init)
    deadline = time.monotonic() + 10
    while not (folder / "ready").exists():
        assert time.monotonic() < deadline, "the init stand-in did not start"
        time.sleep(0.01)
    if record:
        (cdir / "pidstart").write_text(start_time(init.pid))
        (cdir / "pid").write_text(str(init.pid))
    return init


def play_shim(cdir: Path, init: subprocess.Popen) -> threading.Thread:
    """What the shim does: wait for the init, then record its exit code."""
    def shim():
        code = init.wait()
        (cdir / "exitcode").write_text(str(code if code >= 0 else 128 - code))
    thread = threading.Thread(target=shim, daemon=True)
    thread.start()
    return thread


def child_pid(cdir: Path) -> int:
    return int((cdir / "init" / "child").read_text())


def state(docker, name: str) -> dict:
    return docker.find_container(name)["State"]


# ---------------------------------------------------------------- stop of a running container

def assert_stops_at_once_without_signals(docker, name, monkeypatch):
    """docker stop of a container whose init is gone: rc 0, no wait for a pid file, no signal sent."""
    signalled = []
    monkeypatch.setattr(docker.os, "killpg", lambda *a: signalled.append(a))
    monkeypatch.setattr(docker.os, "kill", lambda *a: signalled.append(a))
    started = time.monotonic()
    assert docker.main(["stop", name]) == 0
    assert time.monotonic() - started < docker.PID_FILE_WAIT_S, "it must not wait for a pid file"
    assert signalled == []


def test_stop_terminates_the_whole_process_group_and_returns_with_the_exit_code_recorded(docker, procs, capsys):
    cdir = make_container(docker, "engine")
    init = start_init(cdir, procs)
    play_shim(cdir, init)
    child = child_pid(cdir)
    assert state(docker, "engine")["Running"] is True
    assert state(docker, "engine")["Pid"] == init.pid

    started = time.monotonic()
    assert docker.main(["stop", "-t", "10", "engine"]) == 0
    assert time.monotonic() - started < 5, "a container that exits on SIGTERM must not wait the timeout"
    assert capsys.readouterr().out == "engine\n"
    assert (cdir / "init" / "got-term").exists()
    assert init.poll() == 143
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(child), "the container's other processes (its group) get the SIGTERM too"
    assert (cdir / "exitcode").read_text() == "143", "stop returns once the exit code is recorded"
    assert state(docker, "engine")["Status"] == "exited"
    assert state(docker, "engine")["ExitCode"] == 143


def test_a_container_that_ignores_sigterm_is_killed_once_the_timeout_has_passed(docker, procs):
    cdir = make_container(docker, "stubborn")
    init = start_init(cdir, procs, ignore_term=True)
    play_shim(cdir, init)
    started = time.monotonic()
    assert docker.main(["stop", "-t", "1", "stubborn"]) == 0
    took = time.monotonic() - started
    assert (cdir / "init" / "got-term").exists(), "SIGTERM first"
    assert init.poll() == -signal.SIGKILL, "then SIGKILL"
    assert 1.0 <= took < 5, f"SIGKILL comes after the 1 s timeout, not before or much later ({took:.2f} s)"
    assert state(docker, "stubborn")["ExitCode"] == 137


def test_the_init_reaped_between_the_open_and_the_read_of_its_proc_stat_is_a_stopped_container(
        docker, procs, monkeypatch, capsys):
    """The CI flake: stop polls /proc/<pid>/stat while the engine exits; the shim reaped it after the open
    and before the read, the read raised ProcessLookupError and the CLI died with a traceback (rc 1)."""
    cdir = make_container(docker, "dsv41-head")
    init = start_init(cdir, procs, ignore_term=True)
    stat_path = f"/proc/{init.pid}/stat"
    real_open = open
    raced = []

    def open_then_reap(path, *args, **kwargs):
        handle = real_open(path, *args, **kwargs)
        # Once the container has its SIGTERM, the next look at its stat races its exit: it is reaped (and
        # the shim records its exit code) after the open and before the read.
        if path == stat_path and (cdir / "init" / "got-term").exists() and not raced:
            init.kill()
            init.wait()
            (cdir / "exitcode").write_text("143")
            raced.append(path)
        return handle

    monkeypatch.setattr(docker, "open", open_then_reap, raising=False)
    assert docker.main(["stop", "-t", "10", "dsv41-head"]) == 0
    assert raced, "the test must have raced the read of /proc/<pid>/stat with the exit"
    assert capsys.readouterr().out == "dsv41-head\n"
    monkeypatch.delattr(docker, "open")
    assert state(docker, "dsv41-head")["Status"] == "exited"


def test_stop_resumes_a_paused_container_so_that_it_can_act_on_sigterm(docker, procs):
    cdir = make_container(docker, "paused")
    init = start_init(cdir, procs)
    play_shim(cdir, init)
    assert docker.main(["pause", "paused"]) == 0
    assert state(docker, "paused")["Status"] == "paused"
    started = time.monotonic()
    assert docker.main(["stop", "-t", "10", "paused"]) == 0
    assert time.monotonic() - started < 5
    assert init.poll() == 143, "the paused init handled the SIGTERM (SIGCONT sent), it was not SIGKILLed"
    assert not (cdir / "paused").exists()


# ---------------------------------------------------------------- stop of a container that is not running

def test_stop_of_a_container_whose_init_already_exited_succeeds_without_signalling(docker, procs, monkeypatch):
    cdir = make_container(docker, "done")
    init = start_init(cdir, procs)
    init.terminate()
    init.wait()
    (cdir / "exitcode").write_text("0")
    assert_stops_at_once_without_signals(docker, "done", monkeypatch)
    assert state(docker, "done")["ExitCode"] == 0


def test_stop_with_a_stale_pid_file_of_a_dead_init_and_no_exit_code_succeeds_at_once(docker, procs, monkeypatch):
    """The shim was killed with its container: the pid file names a dead process and no exit code is left."""
    cdir = make_container(docker, "orphan")
    init = start_init(cdir, procs)
    init.kill()
    init.wait()
    assert_stops_at_once_without_signals(docker, "orphan", monkeypatch)
    assert state(docker, "orphan")["Status"] == "exited"
    assert state(docker, "orphan")["Pid"] == 0


@pytest.mark.parametrize("content", ["", "12a", "-1", "0", "\n"])
def test_a_pid_file_that_is_empty_or_not_a_pid_is_waited_for_briefly_then_the_container_is_stopped(
        docker, monkeypatch, content):
    cdir = make_container(docker, "blank")
    (cdir / "pid").write_text(content)
    monkeypatch.setattr(docker, "PID_FILE_WAIT_S", 0.3)
    signalled = []
    monkeypatch.setattr(docker.os, "killpg", lambda *a: signalled.append(a))
    monkeypatch.setattr(docker.os, "kill", lambda *a: signalled.append(a))
    started = time.monotonic()
    assert docker.main(["stop", "blank"]) == 0
    took = time.monotonic() - started
    assert 0.3 <= took < 2, f"waited {took:.2f} s for a pid file"
    assert signalled == [], "0 or -1 would signal the caller's own group or every process"
    assert state(docker, "blank")["Status"] == "exited"


def test_a_pid_file_written_while_stop_waits_for_it_is_used(docker, procs, monkeypatch):
    """A stop that comes while the init starts (no pid file yet) stops the container it then writes."""
    cdir = make_container(docker, "starting")
    init = start_init(cdir, procs, record=False)
    play_shim(cdir, init)
    monkeypatch.setattr(docker, "PID_FILE_WAIT_S", 5.0)

    def init_records_itself():
        time.sleep(0.3)
        (cdir / "pidstart.tmp").write_text(start_time(init.pid))
        os.replace(cdir / "pidstart.tmp", cdir / "pidstart")
        (cdir / "pid.tmp").write_text(str(init.pid))
        os.replace(cdir / "pid.tmp", cdir / "pid")

    threading.Thread(target=init_records_itself, daemon=True).start()
    assert docker.main(["stop", "starting"]) == 0
    assert init.poll() == 143


def test_stop_of_a_container_never_started_returns_at_once(docker):
    make_container(docker, "created", status="created")
    started = time.monotonic()
    assert docker.main(["stop", "created"]) == 0
    assert time.monotonic() - started < docker.PID_FILE_WAIT_S, "it must not wait for a pid file"
    assert state(docker, "created")["Status"] == "created"


# ---------------------------------------------------------------- a pid another process now has

def test_a_pid_reused_by_an_unrelated_session_leader_is_never_signalled(docker, procs):
    """The pid file outlived its container and the number went to a later process that leads its own
    session (another container's init, an sshd session): its start time is not the recorded one."""
    cdir = make_container(docker, "reused")
    unrelated = subprocess.Popen(["sleep", "60"], start_new_session=True)
    procs.append(unrelated)
    (cdir / "pid").write_text(str(unrelated.pid))
    (cdir / "pidstart").write_text(str(int(start_time(unrelated.pid)) - 1))
    assert state(docker, "reused")["Running"] is False, "inspect must not report another process as the container"
    assert docker.main(["stop", "-t", "0", "reused"]) == 0
    assert docker.main(["stop", "-t", "0", "reused"]) == 0
    time.sleep(0.2)
    assert unrelated.poll() is None, "the unrelated process was signalled"


def test_a_pid_reused_by_an_unrelated_process_is_never_signalled_without_a_recorded_start_time(docker, procs):
    """A container started before its init recorded a start time: the pid still must lead its own
    process group and session, which an unrelated sleep does not (the old fallback killed it by pid)."""
    cdir = make_container(docker, "legacy")
    unrelated = subprocess.Popen(["sleep", "60"])
    procs.append(unrelated)
    (cdir / "pid").write_text(str(unrelated.pid))
    assert state(docker, "legacy")["Running"] is False
    assert docker.main(["stop", "-t", "0", "legacy"]) == 0
    assert docker.main(["kill", "legacy"]) == 1
    time.sleep(0.2)
    assert unrelated.poll() is None, "the unrelated process was signalled"


def test_a_running_container_started_before_start_times_were_recorded_is_still_stopped(docker, procs):
    cdir = make_container(docker, "older")
    init = start_init(cdir, procs)
    (cdir / "pidstart").unlink()
    play_shim(cdir, init)
    assert state(docker, "older")["Running"] is True
    assert docker.main(["stop", "older"]) == 0
    assert init.poll() == 143


# ---------------------------------------------------------------- kill, and the CLI's errors

def test_kill_sends_the_signal_asked_for_and_fails_on_a_container_that_is_not_running(docker, procs, capsys):
    cdir = make_container(docker, "target")
    init = start_init(cdir, procs, ignore_term=True)
    play_shim(cdir, init)
    assert docker.main(["kill", "-s", "TERM", "target"]) == 0
    deadline = time.monotonic() + 5
    while not (cdir / "init" / "got-term").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (cdir / "init" / "got-term").exists()
    assert init.poll() is None, "SIGTERM was ignored: the container still runs"
    assert docker.main(["kill", "target"]) == 0
    assert init.poll() == -signal.SIGKILL
    assert (cdir / "exitcode").read_text() == "137"
    capsys.readouterr()
    assert docker.main(["kill", "target"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not running" in err


def test_the_cli_reports_errors_in_one_line_with_dockers_exit_codes(docker, procs, tmp_path):
    env = dict(os.environ, DOCKER_STANDIN_ROOT=docker.ROOT)
    cdir = make_container(docker, "gone")
    init = start_init(cdir, procs)
    init.kill()
    init.wait()

    def cli(*args):
        return subprocess.run([sys.executable, str(DOCKER), *args], env=env, capture_output=True, text=True,
                              timeout=30)

    done = cli("stop", "gone")
    assert (done.returncode, done.stdout, done.stderr) == (0, "gone\n", "")
    missing = cli("stop", "nothere", "gone")
    assert missing.returncode == 1
    assert missing.stdout == "gone\n", "the other containers are still stopped"
    assert missing.stderr == "Error response from daemon: No such container: nothere\n"
    bad = cli("stop", "-t", "soon", "gone")
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    bad_signal = cli("kill", "-s", "NOPE", "gone")
    assert bad_signal.returncode == 1 and bad_signal.stderr == "invalid signal: NOPE\n"
