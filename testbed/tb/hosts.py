"""Bring testbed hosts up and down: namespaces, veths, the per-host init (hostinit.py) and sshd,
then provisioning inside each host (testbed/provision.py)."""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from . import engine as tbengine
from . import scenarios
from .hostinit import HOST_STATE  # noqa: E402
from .common import (CONTROL_NS, CONTROL_PATH_DIR, CONTROLLER_ADDR, HOST_TESTBED, NS_PREFIX, REPO, SUBNET,
                     TESTBED, Layout, TestbedError, host_name, log, ns_name, run)

REQUIRED_TOOLS = {"ip": "iproute2", "unshare": "util-linux", "nsenter": "util-linux",
                  "/usr/sbin/sshd": "openssh-server", "nc": "netcat-openbsd", "ssh-keygen": "openssh-client",
                  "/usr/bin/python3": "python3"}
HOST_NS = re.compile(rf"^{NS_PREFIX}spark[0-9]+$")


def preflight() -> None:
    if os.geteuid() != 0:
        raise TestbedError("the testbed needs root (namespaces and mounts); run it as root")
    missing = sorted({pkg for tool, pkg in REQUIRED_TOOLS.items()
                      if not (os.path.exists(tool) if tool.startswith("/") else shutil.which(tool))})
    if missing:
        raise TestbedError(f"missing packages: {' '.join(missing)}: run `make deps` "
                           f"(apt-get install -y {' '.join(missing)})")
    if _systemctl_source() is None:
        raise TestbedError("docker-systemctl-replacement is not installed (make venv installs it)")


def nsenter(pid: int) -> list[str]:
    return ["nsenter", "-t", str(pid), "-m", "-u", "-n", "--"]


def _systemctl_source() -> str | None:
    spec = importlib.util.find_spec("systemctl2")
    if spec and spec.submodule_search_locations:
        path = os.path.join(list(spec.submodule_search_locations)[0], "systemctl3.py")
        if os.path.exists(path):
            return path
    found = glob.glob(str(REPO / ".venv/lib/python3*/site-packages/systemctl2/systemctl3.py"))
    return found[0] if found else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _listening(pid: int, port: int = 22) -> bool:
    try:
        with open(f"/proc/{pid}/net/tcp") as fh:
            return any(f":{port:04X} 00000000:0000 0A" in line for line in fh)
    except FileNotFoundError:
        return False


def all_alive(layout: Layout, state: dict) -> bool:
    return all(_alive(pid) and _listening(pid) for pid in state.get("pids", {}).values()) and bool(state.get("pids"))


def leftovers(layout: Layout) -> list[str]:
    names = run(["ip", "netns", "list"]).stdout.split()
    return [n for n in names if n == CONTROL_NS or HOST_NS.match(n)]


def _ssh_material(layout: Layout) -> None:
    layout.ssh_dir.mkdir(parents=True, exist_ok=True)
    for key in ("id_ed25519", "host_ed25519_key"):
        if not (layout.ssh_dir / key).exists():
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"sparkfleet-testbed-{key}",
                 "-f", str(layout.ssh_dir / key)])
    shutil.copy(layout.ssh_dir / "id_ed25519.pub", layout.ssh_dir / "authorized_keys")
    os.chmod(layout.ssh_dir / "authorized_keys", 0o600)


def _sshd_config(layout: Layout, spec: dict) -> Path:
    path = layout.host_dir(spec["name"]) / "sshd_config"
    path.write_text("\n".join([
        f"ListenAddress {spec['address']}", "Port 22",
        # Paths as the host sees its state folder (testbed/tb/hostinit.py binds it there).
        f"HostKey {HOST_STATE}/ssh/host_ed25519_key",
        f"AuthorizedKeysFile {HOST_STATE}/ssh/authorized_keys",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "UsePAM no", "StrictModes no", "UseDNS no", "PrintMotd no", "MaxSessions 64", "MaxStartups 64:30:128",
        f"PidFile /run/sshd.pid", "Subsystem sftp internal-sftp", "AcceptEnv LANG LC_*", "",
    ]))
    return path


def _client_config(layout: Layout, specs: list[dict]) -> None:
    """An ssh_config for tools that do not read the Ansible inventory (testinfra's ssh backend, people)."""
    lines = []
    for spec in specs:
        lines += [f"Host {spec['name']}", f"  HostName {spec['address']}", "  User root",
                  f"  IdentityFile {layout.ssh_dir / 'id_ed25519'}",
                  f"  ProxyCommand ip netns exec {CONTROL_NS} nc %h %p",
                  "  StrictHostKeyChecking no", "  UserKnownHostsFile /dev/null", "  LogLevel ERROR",
                  "  ControlMaster auto", f"  ControlPath {CONTROL_PATH_DIR}/tinfra-%C", "  ControlPersist 60s", ""]
    (layout.ssh_dir / "config").write_text("\n".join(lines))
    os.makedirs(CONTROL_PATH_DIR, exist_ok=True)


def _network(count: int) -> None:
    cmds = [["ip", "netns", "add", CONTROL_NS],
            ["ip", "-n", CONTROL_NS, "link", "set", "lo", "up"],
            ["ip", "-n", CONTROL_NS, "link", "add", "br0", "mtu", "9000", "type", "bridge"],
            ["ip", "-n", CONTROL_NS, "addr", "add", f"{CONTROLLER_ADDR}/24", "dev", "br0"],
            ["ip", "-n", CONTROL_NS, "link", "set", "br0", "up"]]
    for index in range(1, count + 1):
        name, ns = host_name(index), ns_name(host_name(index))
        cmds += [["ip", "netns", "add", ns],
                 ["ip", "-n", CONTROL_NS, "link", "add", f"v-{name}", "mtu", "9000", "type", "veth",
                  "peer", "name", "eth0", "netns", ns],
                 ["ip", "-n", CONTROL_NS, "link", "set", f"v-{name}", "master", "br0", "up"],
                 ["ip", "-n", ns, "addr", "add", f"{SUBNET}.{10 + index}/24", "dev", "eth0"],
                 ["ip", "-n", ns, "link", "set", "eth0", "up"]]
    for argv in cmds:
        run(argv)


def _checkpoint(layout: Layout) -> None:
    marker = layout.checkpoint_dir / ".sparkfleet-testbed.json"
    wanted = {"rows": {str(k): v for k, v in scenarios.CHECKPOINT_ROWS.items()}, "shards": 48, "seed": 0}
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return
    if layout.checkpoint_dir.exists():
        _make_writable(layout.checkpoint_dir)
        shutil.rmtree(layout.checkpoint_dir)
    spec = importlib.util.spec_from_file_location("sparkfleet_checkpoint", TESTBED / "checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tmp = layout.checkpoint_dir.with_name("checkpoint.partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    module.make_checkpoint(str(tmp), rows=dict(scenarios.CHECKPOINT_ROWS), shards=48, seed=0)
    (tmp / marker.name).write_text(json.dumps(wanted))
    os.replace(tmp, layout.checkpoint_dir)
    for path in layout.checkpoint_dir.iterdir():
        os.chmod(path, 0o444)


def _make_writable(path: Path) -> None:
    for child in path.rglob("*"):
        os.chmod(child, 0o644 if child.is_file() else 0o755)


def up(layout: Layout, count: int, scenario: str, knobs: list | None = None, engine: str = "docker") -> None:
    marks = [time.monotonic()]

    def phase(name: str) -> None:
        """The profile of `up`: each phase's seconds in state.json (phases) and, with SPARKFLEET_TESTBED_PROFILE=1,
        on stderr."""
        marks.append(time.monotonic())
        phases[name] = round(marks[-1] - marks[-2], 2)
        if os.environ.get("SPARKFLEET_TESTBED_PROFILE") == "1":
            log(f"{name}: {phases[name]:.1f} s")

    phases: dict[str, float] = {}
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    if (layout.state_dir / "hosts").exists():
        shutil.rmtree(layout.state_dir / "hosts")
    _ssh_material(layout)
    shutil.copy(_systemctl_source(), layout.state_dir / "systemctl3.py")
    text = (layout.state_dir / "systemctl3.py").read_text().split("\n", 1)[1]
    (layout.state_dir / "systemctl3.py").write_text("#!/usr/bin/python3\n" + text)
    os.chmod(layout.state_dir / "systemctl3.py", 0o755)
    _checkpoint(layout)
    phase("state folder and checkpoint")
    specs = scenarios.host_specs(count, scenario, knobs or [])
    for spec in specs:
        spec["engine"] = engine
    tbengine.stage_tarballs(layout.state_dir)
    phase("root filesystems")
    state = {"hosts": count, "scenario": scenario, "knobs": knobs or [], "pids": {}, "specs": specs,
             "started": time.time(), "engine": engine, "dockerd": {}}
    layout.write_state(state)
    _network(count)
    for spec in specs:
        hdir = layout.host_dir(spec["name"])
        hdir.mkdir(parents=True, exist_ok=True)
        _sshd_config(layout, spec)
        init_log = open(hdir / "init.log", "w")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns_name(spec["name"]), "unshare", "-m", "-u", "--propagation", "private",
             "/usr/bin/python3", str(TESTBED / "tb" / "hostinit.py"), str(layout.state_dir), json.dumps(spec)],
            stdin=subprocess.DEVNULL, stdout=init_log, stderr=subprocess.STDOUT, start_new_session=True)
        state["pids"][spec["name"]] = proc.pid
        layout.write_state(state)
    deadline = time.monotonic() + 15
    for spec in specs:
        pid = state["pids"][spec["name"]]
        while not _listening(pid):
            if not _alive(pid) or time.monotonic() > deadline:
                tail = (layout.host_dir(spec["name"]) / "init.log").read_text()[-800:]
                raise TestbedError(f"host {spec['name']} did not start its sshd: {tail.strip()}")
            time.sleep(0.02)
    _client_config(layout, specs)
    phase("hosts' sshd")
    enter = {spec["name"]: nsenter(state["pids"][spec["name"]]) for spec in specs}
    logs = {spec["name"]: layout.host_dir(spec["name"]) / "dockerd.log" for spec in specs}
    # Recorded before the wait: a daemon that never answers is still stopped by `down`.
    state["dockerd"] = tbengine.start_daemons(enter, logs, on_start=lambda pids: (
        state.__setitem__("dockerd", dict(pids)), layout.write_state(state)))
    layout.write_state(state)
    phase("dockerd answers")
    provision(layout, state)
    phase("provisioning")
    state["up"] = True
    state["phases"] = phases
    layout.write_state(state)


def provision(layout: Layout, state: dict) -> None:
    """Run testbed/provision.py inside every host, in parallel."""
    procs = {}
    for spec in state["specs"]:
        argv = nsenter(state["pids"][spec["name"]]) + [
            "/usr/bin/python3", f"{HOST_TESTBED}/provision.py", json.dumps(spec)]
        procs[spec["name"]] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                               stderr=subprocess.STDOUT, text=True)
    failed = []
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=600)
        (layout.host_dir(name) / "provision.log").write_text(out)
        if proc.returncode != 0:
            failed.append(f"{name}: {out.strip().splitlines()[-1] if out.strip() else proc.returncode}")
    if failed:
        raise TestbedError("provisioning failed on " + "; ".join(failed))


def _namespace_pids(layout: Layout, state: dict | None) -> set[int]:
    """Every process that lives in a testbed namespace (network or mount): only those we made."""
    pids: set[int] = set()
    for ns in leftovers(layout):
        pids.update(int(p) for p in run(["ip", "netns", "pids", ns], check=False).stdout.split())
    mount_ns = set()
    for pid in list(pids) + list((state or {}).get("pids", {}).values()):
        try:
            mount_ns.add(os.readlink(f"/proc/{pid}/ns/mnt"))
        except OSError:
            pass
    own_mnt = os.readlink("/proc/self/ns/mnt")
    mount_ns.discard(own_mnt)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/mnt") in mount_ns:
                    pids.add(int(entry))
            except OSError:
                pass
    # ssh ControlPersist masters talking to these hosts need no killing: their ProxyCommand (nc in the
    # controller namespace) is among the pids above, and a master exits when its connection goes.
    pids.discard(os.getpid())
    return pids


def down(layout: Layout) -> bool:
    state = layout.read_state()
    if state and state.get("dockerd"):
        # Each host's dockerd first, by its pid: it stops its containers and its containerd.
        tbengine.stop_daemons(state["dockerd"])
    pids = _namespace_pids(layout, state) | tbengine.cgroup_pids()
    for sig in (signal.SIGCONT, signal.SIGTERM):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 3
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    namespaces = leftovers(layout)
    for ns in namespaces:
        run(["ip", "netns", "del", ns], check=False)
    # Reap zombies of hosts started by this process (when down follows a failed up).
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    removed = bool(namespaces or pids or state)
    # Container processes are reaped by the kernel a little after SIGKILL: a cgroup folder goes once empty.
    deadline = time.monotonic() + 15
    while tbengine.cgroup_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    tbengine.remove_cgroups()
    # Everything the testbed made lives in its state folder (overlay uppers, keys, the checkpoint).
    if layout.state_dir.exists():
        shutil.rmtree(layout.state_dir)
    return removed


def status_lines(layout: Layout, state: dict) -> list[str]:
    lines = [f"testbed: {state['hosts']} hosts, scenario {state['scenario']}"
             + "".join(f", knob {h}:{k}" for h, k in state.get("knobs", []))]
    for spec in state["specs"]:
        pid = state["pids"].get(spec["name"])
        ok = pid and _alive(pid) and _listening(pid)
        lines.append(f"{spec['name']:<8} rank {spec['rank']}  {spec['address']:<12} "
                     f"{'up' if ok else 'DOWN'} (sshd pid {pid})")
    return lines
