"""Integration tests run playbooks on the namespaced testbed (testbed/fleet) through ansible-runner and
check the hosts with testinfra. They need root; `make integration` runs them.

Fixtures:
- `testbed`: the seed testbed, brought up once per session when it is not already up.
- `fresh_testbed`: a seed testbed rebuilt for this test (down + up, ~4 s), for tests that change hosts.
- `run_playbook(name, **kw)`: ansible-runner on playbooks/<name>; returns a PlaybookRun.
- `host(name)`: a testinfra host over the same SSH connection Ansible uses.
- `serving_fleet`: a fresh seed testbed serving (engine.yml) on the incumbent the test module's `SLOW_SIM`
  gives (written to inventory/testbed/group_vars/all/incumbent.yml, removed afterwards); test_rollout.py and
  test_campaign.py share it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLEET = [sys.executable, str(ROOT / "testbed" / "fleet")]
INVENTORY = ROOT / "inventory" / "testbed"
INCUMBENT = INVENTORY / "group_vars" / "all" / "incumbent.yml"

pytestmark = pytest.mark.testbed
# testinfra and ansible-runner call ansible-* by name: use the venv that runs the tests.
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


def fleet(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(FLEET + list(args), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"testbed/fleet {' '.join(args)} failed: {proc.stderr}")
    return proc


def state_dir() -> Path:
    return Path(os.environ.get("SPARKFLEET_TESTBED_STATE") or str(
        ROOT / (".testbed" if os.environ.get("SPARKFLEET_TESTBED_ID", "0") in ("", "0")
                else f".testbed-{os.environ['SPARKFLEET_TESTBED_ID']}")))


def _status() -> dict:
    try:
        return json.loads((state_dir() / "state.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def default_engine() -> str:
    """The container engine of the testbed the tests use: a real dockerd per host (the only one since issue 22)."""
    return os.environ.get("SPARKFLEET_TESTBED_ENGINE") or "docker"


def ensure_testbed(scenario: str = "seed", hosts: int = 3, fresh: bool = False, engine: str | None = None) -> None:
    engine = engine or default_engine()
    state = _status()
    up = fleet("status", check=False).returncode == 0
    if fresh or not up or state.get("scenario") != scenario or state.get("hosts") != hosts \
            or state.get("engine") != engine:
        fleet("down")
        fleet("up", "--hosts", str(hosts), "--scenario", scenario, "--engine", engine)


@dataclass
class PlaybookRun:
    rc: int
    status: str
    stdout: str
    events: list = field(default_factory=list)
    run_dir: str = ""

    def results(self, task: str | None = None, module: str | None = None) -> list[dict]:
        """runner_on_ok/failed results, optionally for one task name (substring) or module."""
        out = []
        for ev in self.events:
            if ev.get("event") not in ("runner_on_ok", "runner_on_failed", "runner_on_skipped"):
                continue
            data = ev.get("event_data", {})
            if task and task not in data.get("task", ""):
                continue
            if module and not data.get("task_action", "").endswith(module):
                continue
            res = dict(data.get("res", {}))
            res["_host"] = data.get("host")
            res["_event"] = ev["event"]
            out.append(res)
        return out

    def changed(self) -> list[tuple[str, str]]:
        """(host, task) pairs that reported a change."""
        return [(ev["event_data"]["host"], ev["event_data"]["task"]) for ev in self.events
                if ev.get("event") == "runner_on_ok" and ev["event_data"].get("res", {}).get("changed")]

    def record(self) -> dict:
        return json.loads(Path(self.run_dir, "record.json").read_text())


def run_playbook(playbook: str, extravars: dict | None = None, check: bool = False, diff: bool = False,
                 limit: str | None = None, tags: str | None = None, inventory: Path | None = None) -> PlaybookRun:
    import ansible_runner

    cmdline = []
    if check:
        cmdline.append("--check")
    if diff:
        cmdline.append("--diff")
    private = tempfile.mkdtemp(prefix="sparkfleet-runner-")
    runs_dir = os.environ.get("SPARKFLEET_RUNS_DIR") or str(ROOT / "runs")
    env = {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "SPARKFLEET_RUNS_DIR": runs_dir,
           "ANSIBLE_HOME": os.environ.get("ANSIBLE_HOME", str(ROOT / ".ansible")),
           # ansible-runner replaces the callback path with its own: give ours back.
           "ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "plugins" / "callback")}
    env["SPARKFLEET_TESTBED_STATE"] = str(state_dir())
    if os.environ.get("SPARKFLEET_TESTBED_ID"):
        env["SPARKFLEET_TESTBED_ID"] = os.environ["SPARKFLEET_TESTBED_ID"]
    before = set(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else set()
    r = ansible_runner.run(private_data_dir=private, project_dir=str(ROOT), playbook=str(ROOT / "playbooks" / playbook),
                           inventory=str(inventory or INVENTORY), extravars=extravars or {}, cmdline=" ".join(cmdline),
                           limit=limit, tags=tags, envvars=env, quiet=True)
    stdout = r.stdout.read()
    after = set(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else set()
    stem = Path(playbook).stem
    new = sorted(d for d in after - before if d.endswith("-" + stem))
    return PlaybookRun(rc=r.rc, status=r.status, stdout=stdout, events=list(r.events),
                       run_dir=os.path.join(runs_dir, new[-1]) if new else "")


def locked(host, name: str):
    """The SM clock range the testbed's simulated nvidia-smi holds locked on node name, or None."""
    return json.loads(host(name).file("/run/testbed/gpu.json").content_string).get("locked")


@pytest.fixture(scope="session")
def testbed():
    if os.geteuid() != 0:
        pytest.skip("the testbed needs root")
    ensure_testbed()
    yield
    # Left up for the next test module; `make test` tears it down at the end.


@pytest.fixture
def fresh_testbed():
    if os.geteuid() != 0:
        pytest.skip("the testbed needs root")
    ensure_testbed(fresh=True)
    yield


@pytest.fixture
def serving_fleet(request):
    """A fresh seed testbed serving the incumbent of the module's SLOW_SIM (incumbent.yml text)."""
    ensure_testbed(fresh=True)
    INCUMBENT.write_text(request.module.SLOW_SIM)
    start = run_playbook("engine.yml")
    assert start.rc == 0, start.stdout[-2000:]
    yield
    INCUMBENT.unlink(missing_ok=True)


@pytest.fixture(name="run_playbook")
def run_playbook_fixture():
    return run_playbook


@pytest.fixture
def host():
    import testinfra

    def get(name: str):
        return testinfra.get_host(f"ssh://{name}", ssh_config=str(state_dir() / "ssh" / "config"))
    return get


_ISOLATED: list = [None]  # the running module's isolated inventory (one module runs at a time)


@pytest.fixture(scope="module")
def isolated_inventory(tmp_path_factory):
    """The testbed inventory without group_vars/all/incumbent.yml, and a run folder of this testbed's own.

    playbooks/rollout.yml writes incumbent.yml (kept experiments laid over engine_env) into the shared
    inventory, which would change the env a module's tests expect; engineers on other testbeds write to
    runs/ at the same time."""
    old = os.environ.get("SPARKFLEET_RUNS_DIR")
    os.environ["SPARKFLEET_RUNS_DIR"] = str(ROOT / "runs" / f"testbed-{os.environ.get('SPARKFLEET_TESTBED_ID') or '0'}")
    os.makedirs(os.environ["SPARKFLEET_RUNS_DIR"], exist_ok=True)
    source = ROOT / "inventory" / "testbed"
    inventory = tmp_path_factory.mktemp("inventory")
    for name in ("hosts.yml", "host_vars"):
        (inventory / name).symlink_to(source / name)
    (inventory / "group_vars" / "all").mkdir(parents=True)
    (inventory / "group_vars" / "fleet").symlink_to(source / "group_vars" / "fleet")
    for item in (source / "group_vars" / "all").iterdir():
        if item.name != "incumbent.yml":
            (inventory / "group_vars" / "all" / item.name).symlink_to(item)
    _ISOLATED[0] = inventory
    yield inventory
    _ISOLATED[0] = None
    if old is None:
        os.environ.pop("SPARKFLEET_RUNS_DIR")
    else:
        os.environ["SPARKFLEET_RUNS_DIR"] = old


def play(playbook: str, **kwargs) -> PlaybookRun:
    """run_playbook on the isolated inventory of the running module, whose tests must use the
    `isolated_inventory` fixture (a module-wide `pytest.mark.usefixtures`, or a fixture that takes it)."""
    if _ISOLATED[0] is None:
        raise RuntimeError(f"play({playbook!r}) needs the module to use the isolated_inventory fixture")
    return run_playbook(playbook, inventory=_ISOLATED[0], **kwargs)
