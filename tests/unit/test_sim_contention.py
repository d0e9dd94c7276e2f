"""testbed/engine/sim.py (issue 22): a rank counts its host's busy containers through the host engine's API.

The simulator counted running, not-paused, non-serving containers in `/.testbed-containers`, a folder of the
removed docker CLI stand-in. On the real engine the folder does not exist, so spark3's 19 background containers
counted for nothing (0 ms instead of 19 x 0.15 = 2.85 ms a step) and quiesce had no modelled gain. The GPU hook
stand-in now binds the host's Docker API socket into the container; the rank asks `GET /containers/json` there.
Here a tiny AF_UNIX HTTP server answers as dockerd does (HTTP/1.0, Engine API fields)."""
from __future__ import annotations

import json
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "testbed"))
from engine import sim  # noqa: E402


def container(name: str, state: str, status: str, image: str = "sparkfleet/sleeper:latest") -> dict:
    """One entry of `GET /containers/json` as dockerd 20.10 writes it (the fields a listing carries)."""
    return {"Id": (name.strip("/") * 64)[:64], "Names": [f"/{name}"], "Image": image,
            "ImageID": "sha256:" + "ab" * 32, "Command": "sleep infinity", "Created": 1796601600,
            "Ports": [], "Labels": {}, "State": state, "Status": status,
            "HostConfig": {"NetworkMode": "none"}, "NetworkSettings": {"Networks": {}}, "Mounts": []}


LISTING = [
    container("dsv41-worker", "running", "Up 2 minutes", "dsv41-3x-spark:local"),   # the serving container
    container("grafana", "running", "Up 5 minutes"),
    container("redis", "paused", "Up 5 minutes (Paused)"),
    container("minio", "running", "Up 5 minutes"),
    container("postgres", "paused", "Up 5 minutes (Paused)"),
    container("ollama", "exited", "Exited (0) 1 minute ago"),    # listed only with all=1; never counted
    container("nginx-proxy", "running", "Up 5 minutes"),
]


class Engine:
    """Answers each connection once with `reply(request_bytes)`, then closes it (HTTP/1.0)."""

    def __init__(self, path: Path, reply):
        self.path, self.reply, self.requests = path, reply, []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(4)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                self.requests.append(data)
                answer = self.reply(data)
                if answer is not None:
                    conn.sendall(answer)

    def close(self) -> None:
        self.sock.close()


def ok(listing: list) -> bytes:
    body = json.dumps(listing).encode()
    return (b"HTTP/1.0 200 OK\r\nApi-Version: 1.41\r\nContent-Type: application/json\r\nDocker-Experimental: false\r\n"
            b"Ostype: linux\r\nServer: Docker/20.10.24+dfsg1 (linux)\r\nDate: Mon, 07 Dec 2026 11:00:00 GMT\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


@pytest.fixture
def quiet_host(monkeypatch, tmp_path):
    """No desktop, no nvidia-smi log, no clock cap: only the containers count."""
    monkeypatch.setattr(sim, "DESKTOP_PID", str(tmp_path / "no-desktop.pid"))
    real_open = open

    def no_testbed(path, *a, **kw):
        if str(path).startswith("/.testbed/"):
            raise FileNotFoundError(path)
        return real_open(path, *a, **kw)
    monkeypatch.setattr("builtins.open", no_testbed)
    return tmp_path


def test_running_non_serving_containers_count_each(quiet_host, monkeypatch):
    engine = Engine(quiet_host / "engine.sock", lambda _: ok(LISTING))
    monkeypatch.setenv("SIM_ENGINE_SOCK", str(engine.path))
    try:
        extra, poll_ms = sim.contention_ms()
    finally:
        engine.close()
    # grafana, minio, nginx-proxy: running; redis, postgres paused; ollama exited; dsv41-worker serves.
    assert extra == pytest.approx(3 * 0.15)
    assert poll_ms == 0
    assert engine.requests[0].startswith(b"GET /containers/json HTTP/1.0\r\n")


def test_spark3_seed_19_background_containers_cost_2_85_ms(quiet_host, monkeypatch):
    homelab = [container(f"app{i}", "running", "Up 1 minute") for i in range(19)]
    engine = Engine(quiet_host / "engine.sock", lambda _: ok(homelab + LISTING[:1]))
    monkeypatch.setenv("SIM_ENGINE_SOCK", str(engine.path))
    try:
        assert sim.contention_ms()[0] == pytest.approx(2.85)
        quiet = [dict(c, State="paused", Status="Up 1 minute (Paused)") for c in homelab]
        engine.reply = lambda _: ok(quiet + LISTING[:1])
        assert sim.contention_ms()[0] == pytest.approx(0.0)
    finally:
        engine.close()


@pytest.mark.parametrize("reply", [
    lambda _: b"HTTP/1.0 500 Internal Server Error\r\nContent-Length: 2\r\n\r\n{}",
    lambda _: b"HTTP/1.0 200 OK\r\n\r\nnot json",
    lambda _: b"HTTP/1.0 200 OK\r\n\r\n{\"message\": \"page not found\"}",
    lambda _: b"",
], ids=["500", "not-json", "not-a-list", "closed"])
def test_a_bad_answer_counts_nothing(quiet_host, monkeypatch, reply):
    engine = Engine(quiet_host / "engine.sock", reply)
    monkeypatch.setenv("SIM_ENGINE_SOCK", str(engine.path))
    try:
        assert sim.contention_ms()[0] == 0.0
    finally:
        engine.close()


def test_no_socket_counts_nothing(quiet_host, monkeypatch):
    monkeypatch.setenv("SIM_ENGINE_SOCK", str(quiet_host / "absent.sock"))
    assert sim.contention_ms()[0] == 0.0


def test_an_engine_that_never_answers_costs_the_timeout_only(quiet_host):
    engine = Engine(quiet_host / "engine.sock", lambda _: time.sleep(3))
    try:
        started = time.monotonic()
        assert sim.engine_containers(str(engine.path), timeout_s=0.3) == []
        assert time.monotonic() - started < 2.0
    finally:
        engine.close()
