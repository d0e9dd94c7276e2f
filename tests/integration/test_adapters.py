"""Adapter bundle deployment on the testbed (issue 8): playbooks/adapters.yml, roles/adapters, drift.yml.

The bundle's sources are copies made per test (the testbed's adapters and a frozen copy of kernels/), so that a test
can change, break or un-pin a file without touching the repository. Every run passes preflight_skip=true: the node
preflight is another play's subject (and reads host-wide state that side-by-side testbeds share); everything the
adapters play does is exercised.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from ansible.module_utils import adapter_bundle as ab
from tests.integration.conftest import ROOT, run_playbook

pytestmark = pytest.mark.testbed
HOSTS = {"spark1": "dsv41-head", "spark2": "dsv41-worker", "spark3": "dsv41-worker"}
RECIPE = {"spark1": "/home/mia/dsv41-3x-spark", "spark2": "/home/zurih/dsv41-3x-spark",
          "spark3": "/home/zurih/dsv41-3x-spark"}
SERVING = "dsv41-3x-spark:local"
SELFTEST = ROOT / "roles" / "adapters" / "files" / "adapter_selftest.py"


@pytest.fixture(autouse=True)
def own_runs_dir(tmp_path_factory, monkeypatch):
    """This test's run folders in a folder of its own (runs/ is shared with whoever else runs playbooks)."""
    monkeypatch.setenv("SPARKFLEET_RUNS_DIR", str(tmp_path_factory.mktemp("runs")))


@pytest.fixture
def sources(tmp_path):
    adapter = tmp_path / "adapter"
    kernels = tmp_path / "kernels"
    shutil.copytree(ROOT / "testbed" / "image" / "adapter", adapter)
    shutil.copytree(ROOT / "kernels", kernels, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return adapter, kernels


def extravars(adapter, kernels, **more):
    return {"adapters_source_dir": str(adapter), "adapters_kernels_dir": str(kernels), "preflight_skip": True, **more}


def bundle_hash(adapter, kernels) -> str:
    return ab.build(str(adapter), str(kernels), {"adapter_selftest.py": str(SELFTEST)}).hash


def image_id(h, ref: str):
    out = h.run(f"docker image inspect {ref}")
    return json.loads(out.stdout)[0]["Id"] if out.rc == 0 else None


def rank_view(h, container: str) -> dict:
    """What a rank serves and runs: the serving tag's image, the container's image and the bundle read inside it."""
    c = json.loads(h.check_output(f"docker container inspect {container}"))[0]
    manifest = h.run(f"docker exec {container} cat /opt/dsv41/{ab.MANIFEST_NAME}")
    return {"serving": image_id(h, SERVING), "running": c["Image"], "status": c["State"]["Status"],
            "bundle": json.loads(manifest.stdout)["bundle"] if manifest.rc == 0 else None}


def node_state(h, name: str) -> str:
    """A fingerprint of everything the adapters play may change on a node."""
    return h.check_output(
        f"cd {RECIPE[name]} && "
        "{ sha256sum Dockerfile; find adapter kernels sparkfleet-bundle.json adapter_selftest.py -type f "
        "-exec sha256sum {} + 2>/dev/null | sort; docker images --format '{{.Repository}}:{{.Tag}} {{.ID}}' | sort; "
        "find /var/lib/sparkfleet/adapters -type f -exec sha256sum {} + 2>/dev/null | sort; } | sha256sum")


def changed_on_nodes(run) -> list:
    return [(h, t) for h, t in run.changed() if h in HOSTS]


# ---------------------------------------------------------------- bad input: a clear error before any node changes

def _missing_dir(adapter, kernels, tmp):
    return {"adapters_source_dir": str(tmp / "no-such-checkout" / "adapter")}, "does not exist on the controller"


def _pin_not_in_bundle(adapter, kernels, tmp):
    pins = {"adapter/wo_a_w8.py": hashlib.sha256((adapter / "wo_a_w8.py").read_bytes()).hexdigest(),
            "adapter/wo_a_mid.py": "0" * 64}
    return {"adapters_pins": pins}, "pinned file adapter/wo_a_mid.py is not in the bundle"


def _symlink_outside(adapter, kernels, tmp):
    (tmp / "elsewhere.py").write_text("x = 1\n")
    (adapter / "linked.py").symlink_to(tmp / "elsewhere.py")
    return {}, "adapter/linked.py is a symlink to"


def _unreadable(adapter, kernels, tmp):
    (adapter / "secret.py").write_text("x = 1\n")
    os.chmod(adapter / "secret.py", 0)
    return {}, "adapter/secret.py has no read permission"


def _tp4_wo_a(adapter, kernels, tmp):
    local = hashlib.sha256((adapter / "wo_a_w8.py").read_bytes()).hexdigest()
    (adapter / "wo_a_w8.py").write_text('"""the TP4 profile\'s wo_a_w8.py: G=2 only"""\nGATE = "DSV41_WO_A_W8"\n')
    tp4 = hashlib.sha256((adapter / "wo_a_w8.py").read_bytes()).hexdigest()
    return {}, f"pin violated: adapter/wo_a_w8.py has sha256 {tp4}, pinned {local}"


@pytest.mark.parametrize("damage", [_missing_dir, _pin_not_in_bundle, _symlink_outside, _unreadable, _tp4_wo_a],
                         ids=["missing-dir", "pin-not-in-bundle", "symlink-outside", "unreadable", "pin-violation"])
def test_bad_input_fails_before_any_node_changes(testbed, host, sources, tmp_path, damage):
    adapter, kernels = sources
    override, message = damage(adapter, kernels, tmp_path)
    before = {name: node_state(host(name), name) for name in HOSTS}
    run = run_playbook("adapters.yml", extravars=dict(extravars(adapter, kernels), **override))
    assert run.rc != 0
    assert message in run.stdout
    assert changed_on_nodes(run) == []
    assert {name: node_state(host(name), name) for name in HOSTS} == before
    # The play stopped in its checking play: no task of the deploy ran on any node.
    assert not run.results(task="Copy the bundle archive to every node")


# ---------------------------------------------------------------- the release cycle on one fresh testbed

@pytest.mark.slow
def test_deploy_change_failing_test_and_rollback(fresh_testbed, host, sources, tmp_path):
    adapter, kernels = sources
    views = lambda: {name: rank_view(host(name), c) for name, c in HOSTS.items()}  # noqa: E731
    # Per node: every node builds each release itself, and a real engine gives each node's build its own image id.
    ids = lambda ref: {n: image_id(host(n), ref) for n in HOSTS}  # noqa: E731
    on = lambda image, bundle: {n: {"serving": image[n], "running": image[n], "status": "running",  # noqa: E731
                                    "bundle": bundle} for n in HOSTS}
    seed_image = image_id(host("spark2"), SERVING)

    # 1. First deploy: every node builds and tests bundle A, the serving tag moves, every rank restarts on it.
    bundle_a = bundle_hash(adapter, kernels)
    first = run_playbook("adapters.yml", extravars=extravars(adapter, kernels))
    assert first.rc == 0, first.stdout[-3000:]
    tag_a = f"dsv41-3x-spark:bundle-{bundle_a[:12]}"
    image_a = ids(tag_a)
    after_a = views()
    assert after_a == on(image_a, bundle_a), after_a
    logs = Path(first.run_dir, "adapters")
    assert all("selftest: passed" in (logs / f"{n}-selftest.log").read_text() for n in HOSTS)
    assert "skip import kernels: torch is not installed" in (logs / "spark1-selftest.log").read_text()
    assert len(list(Path(first.run_dir, "boot-logs").glob("*.log"))) >= 3

    # The release tag moved to the tested candidate (community.docker), whose own tag is gone.
    assert {r["_host"] for r in first.results(task="Build the candidate image") if r.get("changed")} == set(HOSTS)
    assert all(image_id(host(n), f"dsv41-3x-spark:candidate-{bundle_a[:12]}") is None for n in HOSTS)

    # 2. The same bundle again: nothing is built, tested, moved or restarted, and no change is reported.
    again = run_playbook("adapters.yml", extravars=extravars(adapter, kernels))
    assert again.rc == 0 and again.changed() == [], again.changed()
    assert all(r["build"] is False for r in again.results(task="decide whether to build"))
    skipped = lambda run, task: [r["_event"] for r in run.results(task=task)] == ["runner_on_skipped"] * 3  # noqa: E731
    assert skipped(again, "Build the candidate image") and skipped(again, "Run the in-image test"), "no build at all"
    assert views() == after_a

    # 3. One adapter file changes: --check reports the rebuild and changes nothing ...
    with open(adapter / "sitecustomize.py", "a") as fh:
        fh.write("# TP3: four local groups (sparkfleet test)\n")
    bundle_b = bundle_hash(adapter, kernels)
    assert bundle_b != bundle_a
    before = {name: node_state(host(name), name) for name in HOSTS}
    check = run_playbook("adapters.yml", extravars=extravars(adapter, kernels), check=True, diff=True)
    assert check.rc == 0, check.stdout[-3000:]
    assert {h for h, t in check.changed() if "Build the candidate image" in t} == set(HOSTS)
    # A check run builds nothing, and its record says so (the build is what would happen).
    assert {r["msg"]["built"] for r in check.results(task="Record: adapters release")} == {False}
    assert "# TP3: four local groups (sparkfleet test)" in check.stdout
    assert {name: node_state(host(name), name) for name in HOSTS} == before and views() == after_a

    # ... and the deploy rebuilds it on every node; all ranks report the same new bundle hash.
    second = run_playbook("adapters.yml", extravars=extravars(adapter, kernels))
    assert second.rc == 0, second.stdout[-3000:]
    assert {r["_host"] for r in second.results(task="Build the candidate image") if r.get("changed")} == set(HOSTS)
    assert {r["_host"] for r in second.results(task="Run the in-image test") if r.get("status") == 0} == set(HOSTS)
    image_b = ids(f"dsv41-3x-spark:bundle-{bundle_b[:12]}")
    after_b = views()
    assert all(image_b[n] != image_a[n] for n in HOSTS)
    assert after_b == on(image_b, bundle_b), after_b

    # 4. An adapter that raises on import fails the in-image test: every node stays on its previous image, by
    # construction (no tag moved before a pass, nothing put back), the output kept as evidence, the failure naming
    # the rank, the host and the failing test.
    (adapter / "broken.py").write_text('raise RuntimeError("broken on purpose")\n')
    bundle_c = bundle_hash(adapter, kernels)
    failing = run_playbook("adapters.yml", extravars=extravars(adapter, kernels))
    assert failing.rc != 0
    assert "rank 0 (spark1): the in-image test of dsv41-3x-spark:candidate-" in failing.stdout
    assert "FAIL import adapter broken: RuntimeError: broken on purpose" in failing.stdout
    assert "FAIL import adapter broken: RuntimeError: broken on purpose" in \
        Path(failing.run_dir, "adapters", "spark1-selftest.log").read_text()
    assert skipped(failing, "Move the release tag to the tested candidate")
    assert not failing.results(task="Point the serving tag at the release")
    assert views() == after_b
    assert all(image_id(host(n), f"dsv41-3x-spark:bundle-{bundle_c[:12]}") is None for n in HOSTS)
    # The failed candidate stays for inspection; the release record does not know it.
    assert all(image_id(host(n), f"dsv41-3x-spark:candidate-{bundle_c[:12]}") for n in HOSTS)

    # 5. Rollback to the release before the last deploy: every rank is back on bundle A's tag and image.
    (adapter / "broken.py").unlink()
    back = run_playbook("adapters.yml", extravars=extravars(adapter, kernels, adapters_release="previous"))
    assert back.rc == 0, back.stdout[-3000:]
    assert views() == on(image_a, bundle_a)
    assert ids(tag_a) == image_a
    kept = json.loads(host("spark2").check_output("cat /var/lib/sparkfleet/adapters/releases.json"))
    assert sorted(kept["releases"]) == sorted([tag_a, f"dsv41-3x-spark:bundle-{bundle_b[:12]}",
                                               f"dsv41-3x-spark:adopted-{seed_image[7:19]}"])

    # 6. drift.yml: per rank the role's own check-mode results against the desired bundle (the source says B): the
    # serving tag would move from A to B (issue 25 item 5: the rows are the role's tasks; the running engine's image
    # is the engine role's row).
    drift = run_playbook("drift.yml", extravars=extravars(adapter, kernels, drift_roles=["adapters"]))
    assert drift.rc == 0, drift.stdout[-3000:]
    items = json.loads(Path(drift.run_dir, "drift.json").read_text())["items"]
    for name in HOSTS:
        rows = {r["item"]: r for r in items[name]}
        serve = rows["adapters Point the serving tag at the release on every node"]
        assert serve["drifted"] and bundle_b[:12] in serve["desired"] and tag_a in serve["actual"], serve
        assert serve["fix"] == "ansible-playbook playbooks/adapters.yml"
