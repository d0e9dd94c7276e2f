"""testbed/standins/runc.py and testbed/tb/engine.py (issue 22): what the real-engine testbed decides on its own.

The runc wrapper lowers what this machine's root may not give a container (a resource limit above its hard
limit, a capability outside its bounding set) and nothing else; the engine is the real one, and an unknown
name (or the removed stand-in) is refused; a missing package names `make deps`;
the daemon's flags keep every host off the machine's network (no bridge, no iptables, no TCP socket)."""
from __future__ import annotations

import importlib.util
import json
import resource
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "testbed"))
from tb import engine  # noqa: E402
from tb.common import TestbedError as BadInput  # noqa: E402

spec = importlib.util.spec_from_file_location("testbed_runc", ROOT / "testbed" / "standins" / "runc.py")
runc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runc)


def hard(kind: int) -> int:
    value = resource.getrlimit(kind)[1]
    return runc.UNLIMITED if value == resource.RLIM_INFINITY else value


def test_a_limit_above_the_machines_is_lowered_and_one_within_it_is_kept():
    stack = min(67108864, hard(resource.RLIMIT_STACK))
    process = {"rlimits": [{"type": "RLIMIT_MEMLOCK", "soft": runc.UNLIMITED, "hard": runc.UNLIMITED},
                           {"type": "RLIMIT_STACK", "soft": stack, "hard": stack}]}
    lowered = runc.clamp_process(process)
    memlock = hard(resource.RLIMIT_MEMLOCK)
    if memlock == runc.UNLIMITED:
        assert lowered == [] and process["rlimits"][0]["hard"] == runc.UNLIMITED
    else:
        assert lowered[0] == {"type": "RLIMIT_MEMLOCK", "asked": [runc.UNLIMITED, runc.UNLIMITED], "set": memlock}
        assert process["rlimits"][0] == {"type": "RLIMIT_MEMLOCK", "soft": memlock, "hard": memlock}
    assert process["rlimits"][1] == {"type": "RLIMIT_STACK", "soft": stack, "hard": stack}


def test_only_capabilities_outside_the_bounding_set_are_left_out(monkeypatch):
    monkeypatch.setattr(runc, "bounding", lambda: {"CAP_CHOWN", "CAP_IPC_LOCK"})
    process = {"capabilities": {"bounding": ["CAP_CHOWN", "CAP_SYS_RESOURCE", "CAP_IPC_LOCK"],
                                "effective": ["CAP_SYS_RESOURCE"]}}
    assert runc.clamp_process(process) == [{"capabilities_left_out": ["CAP_SYS_RESOURCE"]}]
    assert process["capabilities"] == {"bounding": ["CAP_CHOWN", "CAP_IPC_LOCK"], "effective": []}


def test_the_bounding_set_is_read_from_this_process():
    caps = runc.bounding()
    assert caps and all(cap.startswith("CAP_") for cap in caps)


def test_a_bundle_is_rewritten_only_when_something_was_lowered(tmp_path, monkeypatch):
    monkeypatch.setattr(runc, "LOG", str(tmp_path / "log"))
    monkeypatch.setattr(runc, "bounding", lambda: {"CAP_CHOWN"})
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"process": {"capabilities": {"bounding": ["CAP_CHOWN"]}}}))
    before = config.stat().st_mtime_ns, config.read_text()
    runc.rewrite(str(config), is_process=False)
    assert (config.stat().st_mtime_ns, config.read_text()) == before and not (tmp_path / "log").exists()
    config.write_text(json.dumps({"process": {"capabilities": {"bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN"]}}}))
    runc.rewrite(str(config), is_process=False)
    assert json.loads(config.read_text())["process"]["capabilities"]["bounding"] == ["CAP_CHOWN"]
    assert json.loads((tmp_path / "log").read_text())["lowered"] == [{"capabilities_left_out": ["CAP_SYS_ADMIN"]}]


def test_argument_values_are_found_in_both_spellings():
    assert runc._value(["--root", "/r", "create", "--bundle", "/b", "id"], "--bundle", "-b") == "/b"
    assert runc._value(["exec", "--process=/p.json", "id"], "--process", "-p") == "/p.json"
    assert runc._value(["start", "id"], "--bundle", "-b") is None


def test_the_real_engine_is_the_default_and_an_unknown_engine_is_refused_with_the_known_one(monkeypatch):
    monkeypatch.delenv("SPARKFLEET_TESTBED_ENGINE", raising=False)
    assert engine.engine_from_env() == "docker"
    monkeypatch.setenv("SPARKFLEET_TESTBED_ENGINE", "docker")
    assert engine.engine_from_env() == "docker"
    with pytest.raises(BadInput, match="unknown testbed engine 'podman'; known: docker"):
        engine.engine_from_env("podman")


def test_the_removed_stand_in_is_refused_with_what_to_do(monkeypatch):
    monkeypatch.setenv("SPARKFLEET_TESTBED_ENGINE", "standin")
    with pytest.raises(BadInput, match="stand-in was removed .* unset SPARKFLEET_TESTBED_ENGINE or set it to docker"):
        engine.engine_from_env()


def test_missing_daemon_packages_name_the_make_deps_step(monkeypatch):
    monkeypatch.setattr(engine, "DAEMON_TOOLS", {"/nonexistent/dockerd": "docker.io", "/bin/sh": "dash"})
    with pytest.raises(BadInput, match=r"needs Debian packages docker.io: run `make deps`"):
        engine.preflight()


def test_the_daemon_makes_no_bridge_no_rule_and_no_tcp_socket():
    argv = engine.daemon_argv("spark2")
    assert {"--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
            "--userland-proxy=false"} <= set(argv)
    hosts = [argv[i + 1] for i, a in enumerate(argv) if a == "-H"]
    assert hosts == ["unix:///var/run/docker.sock"]
    assert argv[argv.index("--cgroup-parent") + 1] == f"sparkfleet-tb{engine.TESTBED_ID}-spark2"
