"""Checkpoint manifest: build (hash reuse by size and mtime), verify (size, sha256, index completeness, per-node
cache), bad manifests refused before any read, the module on the head and through a worker's volume, the CLI."""
from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from ansible.module_utils import checkpoint_manifest as cm
from tests.conftest import ROOT, load_module
from tests.unit.module_harness import run_module

SHARDS = 6
BIG = "model-00001-of-00006.safetensors"   # holds layer 1's Engram tensors (the biggest file)


def _checkpoint_module():
    spec = importlib.util.spec_from_file_location("sparkfleet_checkpoint", ROOT / "testbed" / "checkpoint.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def ckpt(tmp_path) -> Path:
    out = tmp_path / "DeepSeek-V4.1-Flash"
    info = _checkpoint_module().make_checkpoint(str(out), rows={1: 3001, 14: 2001}, shards=SHARDS, seed=0)
    assert info["files"][1] == BIG
    (out / "config.json").write_text('{"architectures": ["DeepseekV4ForCausalLM"]}\n')
    (out / ".cache").mkdir()
    (out / ".cache" / "download.lock").write_text("x")
    return out


def flip_byte(path: Path, offset: int | None = None) -> None:
    """Corrupt one byte in place, keeping size and mtime (only a hash can tell)."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    offset = len(data) // 2 if offset is None else offset
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_build_lists_every_file_with_size_and_sha256_and_skips_hidden_ones(ckpt):
    result = cm.build(str(ckpt))
    manifest = result["manifest"]
    paths = [e["path"] for e in manifest["files"]]
    assert paths == sorted(paths) and "config.json" in paths and "model.safetensors.index.json" in paths
    assert not any(p.startswith(".") for p in paths) and len(paths) == SHARDS + 2
    big = next(e for e in manifest["files"] if e["path"] == BIG)
    assert big["size"] == (ckpt / BIG).stat().st_size
    assert big["sha256"] == hashlib.sha256((ckpt / BIG).read_bytes()).hexdigest()
    assert result["hashed_files"] == len(paths) and result["reused_files"] == 0
    assert manifest["digest"] == cm.manifest_digest(manifest) and manifest["total_bytes"] == sum(
        e["size"] for e in manifest["files"])


def test_rebuild_rehashes_only_files_whose_size_or_mtime_changed_unless_full(ckpt):
    first = cm.build(str(ckpt))["manifest"]
    again = cm.build(str(ckpt), previous=first)
    assert again["hashed_files"] == 0 and again["manifest"]["files"] == first["files"]
    (ckpt / "config.json").write_text('{"architectures": ["X"]}\n')
    changed = cm.build(str(ckpt), previous=first)
    assert changed["hashed_files"] == 1
    assert cm.build(str(ckpt), previous=first, full=True)["hashed_files"] == SHARDS + 2


def test_a_clean_checkpoint_verifies_and_the_cache_skips_unchanged_files(ckpt):
    manifest = cm.build(str(ckpt))["manifest"]
    first = cm.verify(str(ckpt), manifest)
    assert first["ok"] and first["problems"] == [] and first["hashed_files"] == SHARDS + 2
    assert first["cached_files"] == 0 and first["unlisted"] == []
    second = cm.verify(str(ckpt), manifest, cache=first["cache"])
    assert second["ok"] and second["hashed_files"] == 0 and second["cached_files"] == SHARDS + 2
    assert cm.verify(str(ckpt), manifest, cache=first["cache"], full=True)["hashed_files"] == SHARDS + 2


def test_one_flipped_byte_is_found_in_that_file_only(ckpt):
    manifest = cm.build(str(ckpt))["manifest"]
    flip_byte(ckpt / BIG)
    result = cm.verify(str(ckpt), manifest)
    assert not result["ok"]
    assert [(p["path"], p["kind"]) for p in result["problems"]] == [(BIG, "sha256")]
    assert "same size: corrupted content" in result["problems"][0]["detail"]
    assert BIG not in result["cache"]["files"] and len(result["cache"]["files"]) == SHARDS + 1
    assert cm.describe(result, "spark2").startswith(f"spark2: {BIG}: sha256: sha256 ")


def test_a_cache_from_before_the_corruption_needs_full_to_see_it(ckpt):
    """Size and mtime unchanged is what the cache trusts (documented): full rehashes."""
    manifest = cm.build(str(ckpt))["manifest"]
    clean = cm.verify(str(ckpt), manifest)
    flip_byte(ckpt / BIG)
    assert cm.verify(str(ckpt), manifest, cache=clean["cache"])["ok"]
    assert not cm.verify(str(ckpt), manifest, cache=clean["cache"], full=True)["ok"]


def test_missing_and_truncated_files(ckpt):
    manifest = cm.build(str(ckpt))["manifest"]
    (ckpt / "config.json").unlink()
    with open(ckpt / BIG, "r+b") as fh:
        fh.truncate((ckpt / BIG).stat().st_size - 1)
    kinds = {p["path"]: p["kind"] for p in cm.verify(str(ckpt), manifest)["problems"]}
    assert kinds == {"config.json": "missing", BIG: "size"}


def test_index_completeness(ckpt):
    manifest = cm.build(str(ckpt))["manifest"]
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    index["weight_map"]["layers.99.engram.embed.weight"] = BIG
    index["weight_map"]["layers.98.attn.wq.weight"] = "model-00099-of-00006.safetensors"
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    manifest = cm.build(str(ckpt))["manifest"]
    problems = cm.verify(str(ckpt), manifest)["problems"]
    assert {(p["path"], p["kind"]) for p in problems} == {(BIG, "index"),
                                                          ("model-00099-of-00006.safetensors", "index")}
    assert any("layers.99.engram.embed.weight" in p["detail"] for p in problems)
    assert any("which the manifest does not list" in p["detail"] for p in problems)
    assert cm.verify(str(ckpt), manifest, check_index=False)["ok"]


@pytest.mark.parametrize("bad", ["../escape.safetensors", "/etc/passwd", "sub/../../x", "a/./b"])
def test_a_manifest_listing_a_file_outside_the_checkpoint_is_refused_before_any_read(ckpt, bad, monkeypatch):
    manifest = cm.build(str(ckpt))["manifest"]
    manifest["files"].append({"path": bad, "size": 1, "sha256": "0" * 64})
    monkeypatch.setattr(cm, "hash_file", lambda *a, **k: pytest.fail("read a file"))
    with pytest.raises(cm.ManifestError, match="outside the checkpoint directory"):
        cm.verify(str(ckpt), manifest)


def test_a_link_out_of_the_checkpoint_is_refused(ckpt, tmp_path):
    (tmp_path / "secret").write_text("x")
    os.symlink(tmp_path / "secret", ckpt / "weights.bin")
    with pytest.raises(cm.ManifestError, match="links outside the checkpoint directory"):
        cm.build(str(ckpt))
    manifest = {"files": [{"path": "weights.bin", "size": 1, "sha256": "0" * 64}]}
    with pytest.raises(cm.ManifestError, match="resolves outside the checkpoint directory"):
        cm.verify(str(ckpt), manifest)


def test_malformed_manifests_are_refused(ckpt):
    for manifest, text in (({}, "has no files list"), ({"files": [{"path": "a"}]}, "integer size"),
                           ({"files": [{"path": "a", "size": 1, "sha256": "0" * 64}] * 2}, "twice")):
        with pytest.raises(cm.ManifestError, match=text):
            cm.verify(str(ckpt), manifest)


def test_measure_reports_both_throughputs_and_hashes_everything(ckpt):
    manifest = cm.build(str(ckpt))["manifest"]
    clean = cm.verify(str(ckpt), manifest)
    result = cm.verify(str(ckpt), manifest, cache=clean["cache"], measure=True)
    m = result["measure"]
    assert result["hashed_files"] == SHARDS + 2 and m["read_bytes"] == m["verify_bytes"] == result["bytes"]
    assert m["ratio"] == pytest.approx(m["verify_mb_per_s"] / m["read_mb_per_s"], rel=0.02)


def test_measure_rounds_alternate_pairs_and_compare_medians(ckpt, monkeypatch):
    manifest = cm.build(str(ckpt))["manifest"]
    calls = []
    real_read, real_hash = cm.sequential_read, cm._hash_all
    monkeypatch.setattr(cm, "sequential_read", lambda paths: calls.append("read") or real_read(paths))
    monkeypatch.setattr(cm, "_hash_all", lambda *a: calls.append("verify") or real_hash(*a))
    result = cm.verify(str(ckpt), manifest, measure=True, measure_rounds=3)
    assert calls == ["read", "verify"] * 3, "the passes alternate, the last verification is the real one"
    m = result["measure"]
    assert result["ok"] and m["rounds"] == 3 and len(m["pairs"]) == 3
    assert m["read_seconds"] == pytest.approx(sorted(r for r, _ in m["pairs"])[1], abs=1e-4)
    assert m["verify_seconds"] == pytest.approx(sorted(h for _, h in m["pairs"])[1], abs=1e-4)
    # A corrupted file found by the real verification is still reported with the extra rounds.
    flip_byte(ckpt / BIG)
    bad = cm.verify(str(ckpt), manifest, measure=True, measure_rounds=2)
    assert not bad["ok"] and [p["kind"] for p in bad["problems"]] == ["sha256"]


def test_cli_prints_one_json_line(ckpt, tmp_path):
    manifest_file = tmp_path / "m.json"
    out = io.StringIO()
    with redirect_stdout(out):
        assert cm.main(["build", "--root", str(ckpt), "--json"]) == 0
    manifest_file.write_text(json.dumps(json.loads(out.getvalue())["manifest"]))
    flip_byte(ckpt / BIG)
    out = io.StringIO()
    with redirect_stdout(out):
        assert cm.main(["verify", "--root", str(ckpt), "--manifest", str(manifest_file), "--json"]) == 0
    result = json.loads(out.getvalue())
    assert [p["path"] for p in result["problems"]] == [BIG]
    out = io.StringIO()
    with redirect_stdout(out):
        assert cm.main(["verify", "--root", str(ckpt / "nope"), "--manifest", str(manifest_file), "--json"]) == 1
    assert json.loads(out.getvalue())["failed"] is True


# ------------------------------------------------------------------ the module

@pytest.fixture
def module():
    return load_module("checkpoint_manifest")


def test_module_builds_and_verifies_on_the_head(module, ckpt, tmp_path):
    built = run_module(module, {"state": "built", "path": str(ckpt)})
    assert not built.failed and built.result["changed"] is False and built.result["through"] == "path"
    cache = tmp_path / "state" / "verify.json"
    ok = run_module(module, {"path": str(ckpt), "manifest": built.result["manifest"], "cache": str(cache)})
    assert not ok.failed and ok.result["ok"] and "cache" not in ok.result
    assert len(json.loads(cache.read_text())["files"]) == SHARDS + 2
    again = run_module(module, {"path": str(ckpt), "manifest": built.result["manifest"], "cache": str(cache)})
    assert again.result["hashed_files"] == 0 and again.result["cached_files"] == SHARDS + 2


def test_module_check_mode_reads_the_same_and_writes_no_cache(module, ckpt, tmp_path):
    manifest = run_module(module, {"state": "built", "path": str(ckpt)}).result["manifest"]
    cache = tmp_path / "verify.json"
    out = run_module(module, {"path": str(ckpt), "manifest": manifest, "cache": str(cache)}, check_mode=True)
    assert out.result["ok"] and out.result["hashed_files"] == SHARDS + 2 and not cache.exists()


def test_module_fails_naming_the_host_and_the_file(module, ckpt, tmp_path):
    manifest = run_module(module, {"state": "built", "path": str(ckpt)}).result["manifest"]
    flip_byte(ckpt / BIG)
    out = run_module(module, {"path": str(ckpt), "manifest": manifest, "cache": ""})
    assert out.failed
    assert f"1 checkpoint problem(s) in {ckpt}: {BIG}: sha256:" in out.result["msg"]
    assert out.result["problems"][0]["path"] == BIG


def test_module_refuses_an_outside_path_before_reading(module, ckpt):
    manifest = {"files": [{"path": "../../etc/shadow", "size": 1, "sha256": "0" * 64}]}
    out = run_module(module, {"path": str(ckpt), "manifest": manifest, "cache": ""})
    assert out.failed and "outside the checkpoint directory" in out.result["msg"]


class FakeDocker:
    """Stands in for `docker run` of the verification container: runs the CLI on a local folder."""

    def __init__(self, root: Path, rc: int = 0, stderr: str = ""):
        self.root, self.rc, self.stderr, self.argv = root, rc, stderr, None

    def __call__(self, argv, **kw):
        self.argv = argv
        if self.rc:
            return self.rc, "", self.stderr
        tool = argv[argv.index("-v", argv.index("-v") + 1) + 1].split(":")[0]
        args = argv[argv.index("verify"):]
        args[args.index("--root") + 1] = str(self.root)
        args = [a.replace("/opt/sparkfleet-manifest", tool) for a in args]
        out = io.StringIO()
        with redirect_stdout(out):
            cm.main(args)
        return 0, out.getvalue(), ""


def test_module_verifies_a_worker_through_its_volume_inside_the_image(module, ckpt, monkeypatch, tmp_path):
    manifest = run_module(module, {"state": "built", "path": str(ckpt)}).result["manifest"]
    flip_byte(ckpt / BIG)
    fake = FakeDocker(ckpt)
    monkeypatch.setattr(module.AnsibleModule, "run_command", fake)
    monkeypatch.setattr(module.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: "/usr/bin/docker")
    out = run_module(module, {"volume": "dsv41-weights", "image": "dsv41-3x-spark:local", "manifest": manifest,
                              "cache": str(tmp_path / "c.json")})
    assert out.failed and out.result["through"] == "volume:dsv41-weights"
    assert f"through its dsv41-weights volume: {BIG}: sha256" in out.result["msg"]
    argv = fake.argv
    assert argv[:4] == ["/usr/bin/docker", "run", "--rm", "--network"]
    assert "dsv41-weights:/models/DeepSeek-V4.1-Flash:ro" in argv
    assert argv[argv.index("--entrypoint") + 1:argv.index("--entrypoint") + 3] == ["python3", "dsv41-3x-spark:local"]


def test_module_says_when_a_worker_cannot_mount_its_volume(module, monkeypatch):
    fake = FakeDocker(Path("/nonexistent"), rc=125, stderr=(
        "docker: Error response from daemon: error while mounting volume '/var/lib/docker/volumes/dsv41-weights/"
        "_data': failed to mount local volume: mount :/srv/models/DeepSeek-V4.1-Flash:/var/lib/docker/volumes/"
        "dsv41-weights/_data, data: addr=10.213.4.11: permission denied."))
    monkeypatch.setattr(module.AnsibleModule, "run_command", fake)
    monkeypatch.setattr(module.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: "/usr/bin/docker")
    manifest = {"files": [{"path": "config.json", "size": 1, "sha256": "0" * 64}]}
    out = run_module(module, {"volume": "dsv41-weights", "image": "img", "manifest": manifest, "cache": ""})
    assert out.failed
    assert "cannot read the checkpoint through the dsv41-weights volume" in out.result["msg"]
    assert "permission denied" in out.result["msg"] and "crossmnt" in out.result["msg"]
