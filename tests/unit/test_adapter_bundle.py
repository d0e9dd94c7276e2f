"""Adapter bundles and releases (issue 8): module_utils/adapter_bundle.py, module_utils/adapter_release.py, the
adapter_bundle and adapter_release modules, the in-image test (roles/adapters/files/adapter_selftest.py) and the
simulator's manifest check (testbed/engine/sim.py adapter_present). Docker is a small in-memory fake here; the
integration test (tests/integration/test_adapters.py) runs the same code against each testbed host's real dockerd."""
from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path
from unittest import mock

import pytest

from ansible.module_utils import adapter_bundle as ab
from ansible.module_utils import adapter_release as ar
from tests.conftest import ROOT, load_module
from tests.unit.module_harness import run_module

bundle_module = load_module("adapter_bundle")
release_module = load_module("adapter_release")
SELFTEST = ROOT / "roles" / "adapters" / "files" / "adapter_selftest.py"
ADAPTERS = {
    "wo_a_w8.py": 'GATE = "DSV41_WO_A_W8"\nLOCAL_TP3_GROUPS = 4\n',
    "verify_cap.py": 'GATE = "DSV41_VERIFY_CAP"\n',
    "sitecustomize.py": "import os\n",
}
KERNELS = {"__init__.py": '"""kernels"""\n', "wo_a_w8.py": "def twin():\n    return 1\n"}


def sha(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


@pytest.fixture
def sources(tmp_path):
    adapter, kernels = tmp_path / "adapter", tmp_path / "kernels"
    for folder, files in ((adapter, ADAPTERS), (kernels, KERNELS)):
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text(text)
    return adapter, kernels


def make(adapter, kernels=None, pins=None, **kw):
    return ab.build(str(adapter), str(kernels) if kernels else None,
                    {"adapter_selftest.py": str(SELFTEST)}, pins=pins, **kw)


# ---------------------------------------------------------------- the bundle and its manifest

def test_manifest_lists_every_file_with_size_and_sha256_and_the_hash_is_stable(sources):
    adapter, kernels = sources
    bundle = make(adapter, kernels)
    paths = [f.path for f in bundle.files]
    assert paths == sorted(paths) == ["adapter/sitecustomize.py", "adapter/verify_cap.py", "adapter/wo_a_w8.py",
                                      "adapter_selftest.py", "kernels/__init__.py", "kernels/wo_a_w8.py"]
    wo_a = next(f for f in bundle.files if f.path == "adapter/wo_a_w8.py")
    assert (wo_a.size, wo_a.sha256) == (len(ADAPTERS["wo_a_w8.py"]), sha(ADAPTERS["wo_a_w8.py"]))
    assert make(adapter, kernels).hash == bundle.hash
    manifest = bundle.manifest()
    assert manifest["bundle"] == bundle.hash and ab.parse_manifest(bundle.manifest_text()) == manifest


def test_one_changed_byte_changes_the_bundle_hash(sources):
    adapter, kernels = sources
    before = make(adapter, kernels).hash
    (adapter / "sitecustomize.py").write_text("import os\n#\n")
    assert make(adapter, kernels).hash != before


def test_the_in_image_test_computes_the_same_bundle_hash(sources):
    adapter, kernels = sources
    bundle = make(adapter, kernels)
    spec = __import__("importlib.util").util.spec_from_file_location("selftest_mod", SELFTEST)
    mod = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.bundle_hash(bundle.manifest()["files"]) == bundle.hash == ab.bundle_hash(bundle.manifest()["files"])


def test_caches_dotfiles_and_bytecode_stay_out(sources):
    adapter, kernels = sources
    (adapter / "__pycache__").mkdir()
    (adapter / "__pycache__" / "wo_a_w8.cpython-311.pyc").write_bytes(b"\0")
    (adapter / ".wo_a_w8.py.swp").write_text("x")
    (kernels / "old.pyc").write_bytes(b"\0")
    assert "__pycache__" not in json.dumps([f.path for f in make(adapter, kernels).files])
    assert len(make(adapter, kernels).files) == 6


def test_a_symlink_inside_the_bundle_is_followed_one_outside_is_refused(sources, tmp_path):
    adapter, kernels = sources
    (adapter / "alias.py").symlink_to("verify_cap.py")
    alias = next(f for f in make(adapter).files if f.path == "adapter/alias.py")
    assert alias.sha256 == sha(ADAPTERS["verify_cap.py"])
    (tmp_path / "outside.py").write_text("x = 1\n")
    (adapter / "escape.py").symlink_to(tmp_path / "outside.py")
    with pytest.raises(ab.BundleError) as err:
        make(adapter)
    assert "adapter/escape.py is a symlink to" in err.value.msg and "outside the bundle directory" in err.value.msg


def test_dangling_links_fifos_and_unreadable_files_are_refused_all_in_one_message(sources):
    adapter, _ = sources
    (adapter / "gone.py").symlink_to("nowhere.py")
    os.mkfifo(adapter / "pipe.py")
    (adapter / "locked.py").write_text("x = 1\n")
    os.chmod(adapter / "locked.py", 0)
    with pytest.raises(ab.BundleError) as err:
        make(adapter)
    msg = err.value.msg
    assert "adapter/gone.py is a dangling symlink" in msg
    assert "adapter/pipe.py is not a regular file" in msg
    assert "adapter/locked.py has no read permission (mode 0000)" in msg
    assert len(err.value.extra["problems"]) == 3


def test_a_file_that_fails_to_open_is_refused(sources):
    adapter, _ = sources
    real_open = open

    def deny(path, *args, **kw):
        if str(path).endswith("verify_cap.py"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kw)

    with mock.patch("builtins.open", deny), pytest.raises(ab.BundleError) as err:
        make(adapter)
    assert "adapter/verify_cap.py cannot be read (Permission denied)" in err.value.msg


@pytest.mark.parametrize("path, message", [
    ("/nonexistent/adapter", "adapter_dir /nonexistent/adapter does not exist on the controller"),
    ("", "adapter_dir is empty"),
])
def test_a_missing_adapter_dir_is_refused(path, message):
    with pytest.raises(ab.BundleError, match=message):
        ab.build(path)


def test_an_adapter_dir_without_adapters_is_refused(tmp_path):
    (tmp_path / "README").write_text("x")
    with pytest.raises(ab.BundleError, match="holds no adapter file"):
        ab.build(str(tmp_path))


def test_pins_hold_or_name_the_file_and_both_hashes(sources):
    adapter, kernels = sources
    good = sha(ADAPTERS["wo_a_w8.py"])
    bundle = make(adapter, kernels, pins={"adapter/wo_a_w8.py": good})
    assert bundle.pins == [{"path": "adapter/wo_a_w8.py", "pinned": good, "sha256": good, "ok": True}]
    (adapter / "wo_a_w8.py").write_text('GATE = "DSV41_WO_A_W8"\nGROUPS = 2  # the TP4 file\n')
    with pytest.raises(ab.BundleError) as err:
        make(adapter, kernels, pins={"adapter/wo_a_w8.py": good})
    tp4 = sha('GATE = "DSV41_WO_A_W8"\nGROUPS = 2  # the TP4 file\n')
    assert f"pin violated: adapter/wo_a_w8.py has sha256 {tp4}, pinned {good}" in err.value.msg
    assert "nothing was copied" in err.value.msg
    assert err.value.extra["pins"] == [{"path": "adapter/wo_a_w8.py", "pinned": good, "sha256": tp4, "ok": False}]


def test_a_pin_for_a_file_not_in_the_bundle_or_not_a_sha256_is_refused(sources):
    adapter, kernels = sources
    with pytest.raises(ab.BundleError) as err:
        make(adapter, kernels, pins={"wo_a_w8.py": "0" * 64, "adapter/gone.py": "0" * 64,
                                     "adapter/verify_cap.py": "FILL-from-your-pinned-fork"})
    msg = err.value.msg
    assert "pinned file wo_a_w8.py is not in the bundle (did you mean adapter/wo_a_w8.py, kernels/wo_a_w8.py?" in msg
    assert "pinned file adapter/gone.py is not in the bundle" in msg
    assert "the pin of adapter/verify_cap.py is not a sha256" in msg


# ---------------------------------------------------------------- the module on the controller

def test_module_returns_the_manifest_and_writes_the_archive_only_outside_check_mode(sources, tmp_path):
    adapter, kernels = sources
    args = {"adapter_dir": str(adapter), "kernels_dir": str(kernels), "extra_files": {"adapter_selftest.py": str(SELFTEST)},
            "archive_dir": str(tmp_path / "run")}
    check = run_module(bundle_module, args, check_mode=True)
    assert not check.failed and not check.result["changed"] and "archive" not in check.result
    assert not (tmp_path / "run").exists()
    out = run_module(bundle_module, args)
    res = out.result
    assert not out.failed and not res["changed"] and res["bundle"] == check.result["bundle"]
    assert res["bundle_short"] == res["bundle"][:12] and res["roots"] == {"dirs": ["adapter", "kernels"],
                                                                           "files": ["adapter_selftest.py"]}
    assert res["manifest_text"] == ab.manifest_text(res["manifest"])
    archive = Path(res["archive"]["path"])
    assert archive.name == f"bundle-{res['bundle_short']}.tar" and res["archive"]["written"]
    assert json.loads((archive.parent / f"bundle-{res['bundle_short']}.json").read_text()) == res["manifest"]
    again = run_module(bundle_module, args).result["archive"]
    assert not again["written"] and again["sha256"] == res["archive"]["sha256"]   # byte-identical archive
    contents = ab.read_archive(str(archive), res["manifest"])
    assert contents["adapter/wo_a_w8.py"] == ADAPTERS["wo_a_w8.py"].encode()


def test_module_fails_on_a_pin_violation_with_both_hashes(sources):
    adapter, _ = sources
    out = run_module(bundle_module, {"adapter_dir": str(adapter), "pins": {"adapter/wo_a_w8.py": "a" * 64}})
    assert out.failed and "pin violated: adapter/wo_a_w8.py has sha256" in out.result["msg"]
    assert out.result["pins"][0]["sha256"] == sha(ADAPTERS["wo_a_w8.py"])


def test_a_tampered_archive_is_refused(sources, tmp_path):
    adapter, kernels = sources
    bundle = make(adapter, kernels)
    data = ab.archive_bytes(bundle)
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for info in src.getmembers():
            body = src.extractfile(info).read()
            if info.name == "adapter/verify_cap.py":
                body = body.replace(b"CAP", b"CAQ")
            dst.addfile(info, io.BytesIO(body))
    with pytest.raises(ab.BundleError, match="adapter/verify_cap.py does not match the manifest"):
        ab.read_archive_bytes(out.getvalue(), bundle.manifest())


# ---------------------------------------------------------------- the build context

def test_sync_writes_the_bundle_removes_strays_and_then_changes_nothing(sources, tmp_path):
    adapter, kernels = sources
    bundle = make(adapter, kernels)
    manifest, contents = bundle.manifest(), ab.read_archive_bytes(ab.archive_bytes(bundle), bundle.manifest())
    ctx = tmp_path / "checkout"
    (ctx / "adapter" / "__pycache__").mkdir(parents=True)
    (ctx / "adapter" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (ctx / "adapter" / "tp4_only.py").write_text("x")
    (ctx / "adapter" / "wo_a_w8.py").write_text("old\n")
    (ctx / "Dockerfile").write_text("FROM base\n")
    (ctx / "start.sh").write_text("#!/bin/sh\n")

    check = ab.sync_context(str(ctx), manifest, contents, None, check_mode=True)
    assert "adapter/wo_a_w8.py" in check["written"] and ab.MANIFEST_NAME in check["written"]
    assert sorted(check["removed"]) == ["adapter/__pycache__/x.pyc", "adapter/tp4_only.py"]
    assert "old" in check["diff"]["before"] and "LOCAL_TP3_GROUPS" in check["diff"]["after"]
    assert (ctx / "adapter" / "wo_a_w8.py").read_text() == "old\n" and not (ctx / "kernels").exists()

    done = ab.sync_context(str(ctx), manifest, contents, None, check_mode=False)
    assert done["written"] == check["written"] and done["removed"] == check["removed"]
    assert ab.context_state(str(ctx), manifest) == {"differing": [], "extras": [], "manifest_ok": True}
    assert not (ctx / "adapter" / "__pycache__").exists() and (ctx / "start.sh").exists()
    assert stat.S_IMODE(os.stat(ctx / "kernels" / "wo_a_w8.py").st_mode) == 0o644
    os.chmod(ctx / "adapter" / "verify_cap.py", 0o600)   # a mode change alone changes the image: fixed too
    again = ab.sync_context(str(ctx), manifest, contents, None, check_mode=False)
    assert again["written"] == ["adapter/verify_cap.py"] and again["removed"] == []
    assert ab.sync_context(str(ctx), manifest, contents, None, check_mode=False)["written"] == []


# ---------------------------------------------------------------- releases on a node (fake docker)

class FakeDocker:
    """The docker CLI calls adapter_release makes (and the build community.docker makes, for the tests), in memory. A build's image id is the hash of the base id and
    the context's files (a deterministic stand-in for a real build, whose id also changes with the context)."""

    BASE = "lmsysorg/sglang:dev-dsv41"

    def __init__(self):
        self.tags = {self.BASE: "sha256:" + "b" * 64, "dsv41-3x-spark:local": "sha256:" + "5" * 64}
        self.calls: list = []
        self.containers: dict = {}
        self.manifests: dict = {}

    def resolve(self, ref):
        if ref in self.tags:
            return self.tags[ref]
        return ref if ref.startswith("sha256:") and ref in self.tags.values() else None

    def __call__(self, argv, timeout=None):
        args = argv[1:]
        self.calls.append(args)
        verb = args[0]
        if args[:2] == ["image", "inspect"]:
            image_id = self.resolve(args[2])
            if image_id is None:
                return 1, "[]", f"Error response from daemon: No such image: {args[2]}"
            return 0, json.dumps([{"Id": image_id, "RepoTags": sorted(t for t, i in self.tags.items() if i == image_id)}]), ""
        if verb == "build":
            tag, context = args[2], args[-1]
            digest = hashlib.sha256(self.tags[self.BASE].encode())
            for path in sorted(Path(context).rglob("*")):
                if path.is_file():
                    digest.update(str(path.relative_to(context)).encode() + path.read_bytes())
            self.tags[tag] = "sha256:" + digest.hexdigest()
            return 0, "Successfully built\n", ""
        if args[:2] == ["container", "inspect"]:
            c = self.containers.get(args[2])
            return (0, json.dumps([c]), "") if c else (1, "[]", f"Error: No such object: {args[2]}")
        if verb == "exec":
            text = self.manifests.get(args[1])
            return (0, text, "") if text else (1, "", "cat: No such file or directory")
        raise AssertionError(f"unexpected docker call {args}")

    def builds(self):
        return [c for c in self.calls if c[0] == "build"]


@pytest.fixture
def node(sources, tmp_path):
    """A node: its recipe checkout (Dockerfile), the bundle archive copied into its state dir, fake docker."""
    adapter, kernels = sources
    ctx = tmp_path / "checkout"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {FakeDocker.BASE}\nCOPY adapter/ /opt/dsv41/adapter/\n")
    state = tmp_path / "state"

    class Node:
        docker = FakeDocker()

        def bundle(self):
            b = make(adapter, kernels)
            (state / "bundles").mkdir(parents=True, exist_ok=True)
            archive = ab.write_archive(b, str(state / "bundles"))["path"]
            return b, archive

        def prepare(self, check_mode=False, **kw):
            b, archive = self.bundle()
            req = ar.BuildRequest(context=str(ctx), manifest=b.manifest(), image_repo="dsv41-3x-spark",
                                  state_dir=str(state), serving_image="dsv41-3x-spark:local", archive=archive, **kw)
            return ar.prepare(req, ar.Docker(self.docker), check_mode)

        def build(self, check_mode=False, test_status=0, test_output="selftest: passed", **kw):
            """What roles/adapters/tasks/build.yml does: prepare; when it says build, community.docker builds the
            candidate, runs the test, moves the release tag after a pass; then tested records (or fails)."""
            plan = self.prepare(check_mode, **kw)
            out = dict(plan, built=False)
            if not plan["build"] or check_mode:
                return out
            self.docker(["docker", "build", "-t", plan["candidate"], "-f", str(ctx / "Dockerfile"), str(ctx)])
            image_id = self.docker.tags[plan["candidate"]]
            if test_status == 0:
                self.docker.tags[plan["tag"]] = image_id
            rec = ar.tested(str(state), "dsv41-3x-spark:local", plan, image_id, test_status, test_output,
                            "rank 1 (spark2)", "runs/x/adapters/spark2-selftest.log")
            self.docker.tags.pop(plan["candidate"])
            return dict(out, built=True, tested=rec["tested"], image_id=image_id, changed=True)

        def serve(self, release, check_mode=False, **kw):
            """What roles/adapters/tasks/serve.yml does: the plan, community.docker's tag moves and removals, the
            record."""
            req = ar.ServeRequest(image_repo="dsv41-3x-spark", serving_image="dsv41-3x-spark:local",
                                  state_dir=str(state), release=release, **kw)
            plan = ar.serve(req, ar.Docker(self.docker), check_mode)
            if check_mode:
                return plan
            if plan["adopted"]:
                self.docker.tags[plan["adopted"]] = plan["previous_image_id"]
            if plan["moved"]:
                self.docker.tags["dsv41-3x-spark:local"] = self.docker.tags[plan["release"]]
            for tag in plan["remove"]:
                self.docker.tags.pop(tag)
            written = ar.record_serving(str(state), "dsv41-3x-spark:local", plan["record"], plan["pruned_archives"],
                                        False)
            return dict(plan, changed=plan["changed"], recorded=written["changed"])

        def record(self):
            return json.loads((state / "releases.json").read_text())

    n = Node()
    n.ctx, n.state, n.adapter = ctx, state, adapter
    return n


def test_prepare_writes_the_context_and_decides_to_build_then_nothing_once_the_release_is_recorded(node):
    plan = node.prepare()
    assert plan["changed"] and plan["build"] and plan["tag"] == "dsv41-3x-spark:bundle-" + plan["bundle"][:12]
    assert plan["candidate"] == "dsv41-3x-spark:candidate-" + plan["bundle"][:12]
    assert (plan["candidate_name"], plan["candidate_tag"]) == ("dsv41-3x-spark", "candidate-" + plan["bundle"][:12])
    assert plan["build_reasons"] == [f"no image is tagged {plan['tag']}"]
    assert node.docker.builds() == [], "prepare never builds: community.docker.docker_image does"
    assert (node.ctx / ab.MANIFEST_NAME).read_text() == ab.manifest_text(node.bundle()[0].manifest())
    first = node.build()
    assert first["built"] and first["tested"]
    rel = node.record()["releases"][first["tag"]]
    assert rel["image_id"] == first["image_id"] and rel["tested_at"] and rel["base_id"] == "sha256:" + "b" * 64
    again = node.prepare()
    assert not again["changed"] and not again["build"] and again["build_reasons"] == []
    assert again["image_id"] == first["image_id"]
    assert len(node.docker.builds()) == 1


def test_recording_the_same_tested_release_again_changes_nothing(node):
    first = node.build()
    plan = dict(node.prepare(), build=True)
    again = ar.tested(str(node.state), "dsv41-3x-spark:local", plan, first["image_id"], 0, "selftest: passed", "n")
    assert again["tested"] and not again["changed"]


def test_a_new_base_image_or_dockerfile_rebuilds_the_same_bundle(node):
    node.build()
    node.docker.tags[FakeDocker.BASE] = "sha256:" + "c" * 64
    out = node.build()
    assert out["built"] and any("the base image lmsysorg/sglang:dev-dsv41 changed" in r for r in out["build_reasons"])
    with open(node.ctx / "Dockerfile", "a") as fh:
        fh.write("LABEL x=y\n")
    assert node.build()["build_reasons"] == ["Dockerfile changed"]
    assert len(node.docker.builds()) == 3


def test_a_release_tag_moved_by_hand_or_never_tested_is_rebuilt():
    rel = {"image_id": "sha256:" + "1" * 64, "bundle": "b" * 64, "base_id": "sha256:x", "dockerfile_sha256": "d",
           "tested_at": ""}
    args = ("repo:bundle-bbbbbbbbbbbb", "sha256:" + "2" * 64, "b" * 64, "base", "sha256:x", "Dockerfile", "d")
    assert ar.build_reasons(rel, *args) == [
        "repo:bundle-bbbbbbbbbbbb points at sha256:222222222222, not the tested sha256:111111111111",
        "the image was never tested"]
    assert ar.build_reasons(None, *args) == ["repo:bundle-bbbbbbbbbbbb is not a recorded, tested release"]


def test_check_mode_builds_nothing_and_says_what_would_change(node):
    out = node.build(check_mode=True)
    assert out["changed"] and out["build"] and not out["built"] and out["build_reasons"]
    assert "adapter/wo_a_w8.py" in out["written"] and "== adapter/wo_a_w8.py" in out["diff"]["after"]
    assert node.docker.builds() == [] and not (node.ctx / "adapter").exists() and not (node.state / "releases.json").exists()


def test_check_mode_before_the_archive_reached_the_node_diffs_the_preview(node):
    b, archive = node.bundle()
    os.unlink(archive)                              # a check run does not copy the archive
    req = ar.BuildRequest(context=str(node.ctx), manifest=b.manifest(), image_repo="dsv41-3x-spark",
                          state_dir=str(node.state), serving_image="dsv41-3x-spark:local", archive=archive,
                          preview={"adapter/wo_a_w8.py": ADAPTERS["wo_a_w8.py"], "adapter/verify_cap.py": "stale\n"})
    out = ar.prepare(req, ar.Docker(node.docker), True)
    assert "LOCAL_TP3_GROUPS = 4" in out["diff"]["after"]                        # text from the preview
    assert f"(sha256 {sha(ADAPTERS['verify_cap.py'])})" in out["diff"]["after"]  # a preview that does not match
    with pytest.raises(ar.ReleaseError, match="is not on this node; copy it first"):
        ar.prepare(req, ar.Docker(node.docker), False)


def test_a_failing_in_image_test_moves_no_tag_records_nothing_and_names_the_node_and_the_test(node):
    first = node.build()
    with open(node.adapter / "sitecustomize.py", "a") as fh:
        fh.write("# changed\n")
    output = "ok   manifest: bundle 0123, 9 files\nFAIL import adapter broken: RuntimeError: boom\nselftest: FAILED\n"
    with pytest.raises(ar.ReleaseError) as err:
        node.build(test_status=1, test_output=output)
    msg = err.value.msg
    assert msg.startswith("rank 1 (spark2): the in-image test of dsv41-3x-spark:candidate-") and "failed (exit 1)" in msg
    assert "FAIL import adapter broken: RuntimeError: boom" in msg and "ok   manifest" not in msg
    assert "this node stays on its previous image (output: runs/x/adapters/spark2-selftest.log)" in msg
    assert "RuntimeError: boom" in err.value.extra["test_output"]
    new_tag = "dsv41-3x-spark:bundle-" + node.prepare()["bundle"][:12]
    assert new_tag not in node.docker.tags and list(node.record()["releases"]) == [first["tag"]]
    assert node.docker.tags["dsv41-3x-spark:local"] == "sha256:" + "5" * 64
    with pytest.raises(ar.ReleaseError, match=r"rank 1 \(spark2\): .* failed \(it did not run\): no such image"):
        ar.tested(str(node.state), "dsv41-3x-spark:local", node.prepare(), None, None, "no such image",
                  "rank 1 (spark2)")


def test_a_context_the_archive_does_not_match_is_refused(node):
    b, archive = node.bundle()
    Path(archive).write_bytes(b"not a tar")
    req = ar.BuildRequest(context=str(node.ctx), manifest=b.manifest(), image_repo="dsv41-3x-spark",
                          state_dir=str(node.state), serving_image="dsv41-3x-spark:local", archive=archive)
    with pytest.raises(ab.BundleError, match="the bundle archive cannot be read"):
        ar.prepare(req, ar.Docker(node.docker), False)


def test_serving_adopts_the_old_image_then_rollback_to_previous_is_idempotent(node):
    old_id = node.docker.tags["dsv41-3x-spark:local"]
    tag = node.build()["tag"]
    check = node.serve(tag, check_mode=True)
    assert check["changed"] and check["moved"] and node.docker.tags["dsv41-3x-spark:local"] == old_id
    out = node.serve(tag)
    adopted = "dsv41-3x-spark:adopted-" + "5" * 12
    assert out["moved"] and out["adopted"] == adopted and out["previous_release"] == adopted
    assert node.docker.tags["dsv41-3x-spark:local"] == node.docker.tags[tag] == out["image_id"]
    assert node.docker.tags[adopted] == old_id
    assert not node.serve(tag)["changed"]                         # the same release again: nothing
    back = node.serve("previous", action="rollback")
    assert back["moved"] and back["release"] == adopted and node.docker.tags["dsv41-3x-spark:local"] == old_id
    again = node.serve("previous", action="rollback")
    assert not again["changed"] and again["release"] == adopted    # previous = before the last deploy
    forward = node.serve(tag)
    assert forward["moved"] and [h["action"] for h in node.record()["history"]] == [
        "adopt", "deploy", "rollback", "deploy"]


def test_old_releases_beyond_keep_releases_are_removed_with_their_archives(node):
    tags = []
    for n in range(4):
        (node.adapter / "sitecustomize.py").write_text(f"import os\n# release {n}\n")
        tags.append(node.build()["tag"])
        node.serve(tags[-1], keep_releases=2)
    record = node.record()
    assert list(ar.activation_order(record)) == [tags[3], tags[2]]
    assert all(t not in node.docker.tags for t in tags[:2] + ["dsv41-3x-spark:adopted-" + "5" * 12])
    assert sorted(n for n in os.listdir(node.state / "bundles") if n.endswith(".tar")) == sorted(f"{t.split(':')[1]}.tar" for t in tags[2:])
    with pytest.raises(ar.ReleaseError, match="is not kept on this node"):
        node.serve(tags[0])


@pytest.mark.parametrize("selector", ["bundle", "short", "prefix"])
def test_a_release_is_named_by_tag_its_suffix_or_a_bundle_hash_prefix(node, selector):
    built = node.build()
    node.serve(built["tag"])
    name = {"bundle": built["tag"], "short": built["tag"].split(":")[1], "prefix": built["bundle"][:16]}[selector]
    record = ar.load_record(str(node.state), "dsv41-3x-spark:local")
    assert ar.resolve(record, name, None)["tag"] == built["tag"]
    with pytest.raises(ar.ReleaseError, match="is not kept"):
        ar.resolve(record, "bundle-000000000000", None)


def test_previous_without_a_deploy_is_a_clear_error(node):
    with pytest.raises(ar.ReleaseError, match="no previous release is recorded"):
        node.serve("previous", action="rollback")


def test_query_reads_the_running_bundle_inside_the_container(node):
    built = node.build()
    node.serve(built["tag"])
    node.docker.containers["dsv41-head"] = {"Image": built["image_id"], "State": {"Status": "running"},
                                            "Config": {"Image": "dsv41-3x-spark:local"}}
    node.docker.manifests["dsv41-head"] = ab.manifest_text(node.bundle()[0].manifest())
    view = ar.query("dsv41-3x-spark", "dsv41-3x-spark:local", str(node.state), ["dsv41-head", "dsv41-worker"],
                    ar.Docker(node.docker), selector="previous")
    (head,) = view["containers"]
    assert head["bundle"] == built["bundle"] and head["tag"] == built["tag"] and head["release"] == built["tag"]
    assert view["current"]["tag"] == built["tag"] and view["resolved"]["tag"].startswith("dsv41-3x-spark:adopted-")
    ctx = ar.context_view(str(node.ctx), "Dockerfile", "", ["COPY kernels/ /opt/dsv41/kernels/"], ar.Docker(node.docker))
    assert ctx["base_id"] == "sha256:" + "b" * 64 and ctx["missing_lines"] == ["COPY kernels/ /opt/dsv41/kernels/"]
    del node.docker.tags[FakeDocker.BASE]
    assert "is not on this node" in ar.context_view(str(node.ctx), "Dockerfile", "", [], ar.Docker(node.docker))["problems"][0]


def test_release_module_in_check_mode_and_with_a_diff(node):
    b, archive = node.bundle()
    args = {"state": "prepared", "context": str(node.ctx), "manifest": b.manifest(), "archive": archive,
            "image_repo": "dsv41-3x-spark", "serving_image": "dsv41-3x-spark:local", "state_dir": str(node.state)}
    with mock.patch.object(release_module, "subprocess_runner", node.docker):
        check = run_module(release_module, args, check_mode=True, diff=True)
        assert not check.failed and check.result["changed"] and "== adapter/wo_a_w8.py" in check.result["diff"]["after"]
        assert not (node.ctx / "adapter").exists()
        prepared = run_module(release_module, args)
        assert prepared.result["build"] and "diff" not in prepared.result and node.docker.builds() == []
        plan = prepared.result
        node.docker.tags[plan["tag"]] = node.docker.tags[plan["candidate"]] = "sha256:" + "e" * 64
        tested_args = {"state": "tested", "prepared": plan, "image_id": "sha256:" + "e" * 64, "test_status": 0,
                       "image_repo": "dsv41-3x-spark", "serving_image": "dsv41-3x-spark:local",
                       "state_dir": str(node.state)}
        check = run_module(release_module, tested_args, check_mode=True)
        assert check.result["changed"] and not (node.state / "releases.json").exists()
        recorded = run_module(release_module, tested_args)
        assert recorded.result["changed"] and node.record()["releases"][plan["tag"]]["image_id"] == "sha256:" + "e" * 64
        assert not run_module(release_module, args).result["build"]
        failed = run_module(release_module, dict(tested_args, test_status=2, test_output="FAIL x", node="rank 0 (spark1)"))
        assert failed.failed and failed.result["msg"].startswith("rank 0 (spark1): the in-image test of ")
        serving = {"state": "serving", "release": plan["tag"], "image_repo": "dsv41-3x-spark",
                   "serving_image": "dsv41-3x-spark:local", "state_dir": str(node.state)}
        would = run_module(release_module, serving, check_mode=True, diff=True)
        assert would.result["changed"] and "-> dsv41-3x-spark:bundle-" in would.result["diff"]["after"]
        moved = run_module(release_module, serving, diff=True)
        assert moved.result["moved"] and not moved.result["changed"], "it moves nothing: community.docker does"
        assert node.docker.tags["dsv41-3x-spark:local"] == "sha256:" + "5" * 64
        assert moved.result["adopted"] == "dsv41-3x-spark:adopted-" + "5" * 12
        served = {"state": "served", "record": moved.result["record"], "image_repo": "dsv41-3x-spark",
                  "serving_image": "dsv41-3x-spark:local", "state_dir": str(node.state)}
        assert run_module(release_module, served, check_mode=True).result["changed"]
        assert "deploy" not in [h["action"] for h in node.record()["history"]]
        assert run_module(release_module, served).result["changed"]
        assert [h["action"] for h in node.record()["history"]] == ["adopt", "deploy"]
        assert not run_module(release_module, served).result["changed"]
        missing = run_module(release_module, dict(serving, release="bundle-0123456789ab"))
        assert missing.failed and "release 'bundle-0123456789ab' is not kept on this node" in missing.result["msg"]


# ---------------------------------------------------------------- the in-image test

@pytest.fixture
def image_root(sources, tmp_path):
    """An image's /opt/dsv41 as roles/adapters bakes it: adapter/, kernels/, the test and the manifest."""
    adapter, kernels = sources
    bundle = make(adapter, kernels)
    root = tmp_path / "opt-dsv41"
    root.mkdir()
    for path, data in ab.read_archive_bytes(ab.archive_bytes(bundle), bundle.manifest()).items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    return root


def selftest(root):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, str(SELFTEST), "--root", str(root)], capture_output=True, text=True, env=env)


def test_selftest_passes_on_a_good_image_and_says_the_kernels_import_is_conditional(image_root):
    out = selftest(image_root)
    assert out.returncode == 0, out.stdout
    assert "ok   import adapter wo_a_w8" in out.stdout and "kernels: 2 of 2 sources compile" in out.stdout
    torch = __import__("importlib.util").util.find_spec("torch") is not None
    assert ("ok   import kernels" if torch else "skip import kernels: torch is not installed") in out.stdout


@pytest.mark.parametrize("damage, expected", [
    (lambda r: (r / "adapter" / "verify_cap.py").write_text("raise RuntimeError('broken on purpose')\n"),
     "adapter/verify_cap.py: sha256"),
    (lambda r: (r / "adapter" / "stray.py").write_text("x = 1\n"), "adapter/stray.py: in the image's adapter directory"),
    (lambda r: (r / "kernels" / "wo_a_w8.py").unlink(), "file kernels/wo_a_w8.py: missing in the image"),
])
def test_selftest_fails_on_an_image_that_is_not_the_bundle(image_root, damage, expected):
    damage(image_root)
    out = selftest(image_root)
    assert out.returncode == 1 and expected in out.stdout, out.stdout


@pytest.mark.parametrize("name", ["broken", "sitecustomize"])
def test_selftest_fails_when_an_adapter_raises_on_import(sources, tmp_path, name):
    adapter, kernels = sources
    (adapter / f"{name}.py").write_text("raise RuntimeError('broken on purpose')\n")
    bundle = make(adapter, kernels)
    root = tmp_path / "img"
    for path, data in ab.read_archive_bytes(ab.archive_bytes(bundle), bundle.manifest()).items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    out = selftest(root)
    assert out.returncode == 1
    assert f"FAIL import adapter {name}: RuntimeError: broken on purpose" in out.stdout


# ---------------------------------------------------------------- the simulator reads the manifest

@pytest.fixture
def sim(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "testbed"))
    from engine import sim as sim_mod
    adapter_dir = tmp_path / "adapter"
    adapter_dir.mkdir()
    (adapter_dir / "wo_a_w8.py").write_text("local\n")
    (adapter_dir / "verify_cap.py").write_text("cap\n")
    monkeypatch.setattr(sim_mod, "ADAPTER_DIR", str(adapter_dir))
    monkeypatch.setattr(sim_mod, "BUNDLE_MANIFEST", str(tmp_path / "sparkfleet-bundle.json"))
    return sim_mod, tmp_path


def test_sim_without_a_manifest_goes_by_the_files(sim):
    mod, _ = sim
    assert mod.adapter_present("wo_a_w8.py") and not mod.adapter_present("block_verify.py")


def test_sim_with_a_manifest_prints_markers_only_for_listed_files_with_their_hash(sim):
    mod, tmp = sim
    (tmp / "sparkfleet-bundle.json").write_text(json.dumps({"files": [
        {"path": "adapter/wo_a_w8.py", "size": 6, "sha256": sha("local\n")},
        {"path": "adapter/verify_cap.py", "size": 4, "sha256": sha("other\n")}]}))
    assert mod.adapter_present("wo_a_w8.py")
    assert not mod.adapter_present("verify_cap.py")          # listed, but the file in the image differs
    assert not mod.adapter_present("block_verify.py")
