#!/usr/bin/env python3
"""sparkfleet's in-image test of an adapter bundle (roles/adapters ships it in every bundle; the image has it
at /opt/dsv41/adapter_selftest.py). roles/adapters runs it in every freshly built image before the image may
serve:

    docker run --rm --network none --entrypoint python3 <image> /opt/dsv41/adapter_selftest.py

1. the manifest (/opt/dsv41/sparkfleet-bundle.json) is well formed and its bundle hash matches its files;
2. every file it lists is in the image with its size and sha256, and the adapter directory holds nothing else;
3. every adapter module imports (a module that raises on import fails the test);
4. the kernels package: every source compiles; `import kernels` runs only when torch is in the image (the
   testbed's image has no torch: the import is skipped and the output says so).
Exit 0 when all pass, 1 otherwise; one line per check. Standard library only (any python3 in the image).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import os
import sys
import traceback

FORMAT = 1


def bundle_hash(files: list) -> str:
    # The same computation as module_utils/adapter_bundle.py (a unit test keeps them equal).
    entries = sorted(({"path": e["path"], "size": int(e["size"]), "sha256": e["sha256"]} for e in files),
                     key=lambda e: e["path"])
    canonical = json.dumps({"format": FORMAT, "files": entries}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv: list) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/opt/dsv41", help="where the bundle's paths start in the image")
    parser.add_argument("--manifest", default=None, help="the manifest (default <root>/sparkfleet-bundle.json)")
    args = parser.parse_args(argv)
    sys.dont_write_bytecode = True
    root = args.root
    failures = []

    def fail(line: str) -> None:
        failures.append(line)
        print(f"FAIL {line}")

    manifest_path = args.manifest or os.path.join(root, "sparkfleet-bundle.json")
    try:
        with open(manifest_path) as fh:
            manifest = json.load(fh)
        files = manifest["files"]
        if manifest.get("format") != FORMAT:
            raise ValueError(f"format {manifest.get('format')!r}, expected {FORMAT}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"FAIL manifest {manifest_path}: {exc}")
        return 1
    computed = bundle_hash(files)
    if computed != manifest.get("bundle"):
        fail(f"manifest: bundle hash {manifest.get('bundle')} does not match its files ({computed})")
    else:
        print(f"ok   manifest: bundle {computed[:12]}, {len(files)} files")

    listed = set()
    bad = 0
    for entry in files:
        path = os.path.join(root, entry["path"])
        listed.add(entry["path"])
        if not os.path.isfile(path):
            fail(f"file {entry['path']}: missing in the image")
            bad += 1
        elif os.path.getsize(path) != entry["size"] or sha256(path) != entry["sha256"]:
            fail(f"file {entry['path']}: sha256 {sha256(path)} ({os.path.getsize(path)} bytes) in the image, "
                 f"bundle says {entry['sha256']} ({entry['size']} bytes)")
            bad += 1
    if not bad:
        print(f"ok   files: all {len(files)} match the manifest")
    adapter_dir = os.path.join(root, "adapter")
    for dirpath, dirnames, filenames in os.walk(adapter_dir):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            if rel not in listed and not name.endswith((".pyc", ".pyo")):
                fail(f"file {rel}: in the image's adapter directory but not in the bundle")

    modules = sorted(e["path"][len("adapter/"):-3] for e in files
                     if e["path"].startswith("adapter/") and e["path"].endswith(".py") and e["path"].count("/") == 1)
    sys.path.insert(0, adapter_dir)
    for name in modules:
        path = os.path.join(adapter_dir, name + ".py")
        loaded = sys.modules.get(name)
        try:
            # sitecustomize already ran at interpreter start when the adapter dir is on PYTHONPATH; any other module
            # of that name (the distribution's own sitecustomize) does not count: load the bundle's file.
            if loaded is None or os.path.realpath(getattr(loaded, "__file__", "") or "") != os.path.realpath(path):
                spec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                spec.loader.exec_module(module)
            print(f"ok   import adapter {name}")
        except BaseException as exc:  # an adapter may raise anything on import, SystemExit included
            detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
            fail(f"import adapter {name}: {detail}")

    kernel_sources = [e["path"] for e in files if e["path"].startswith("kernels/") and e["path"].endswith(".py")]
    compiled = 0
    for rel in kernel_sources:
        try:
            with open(os.path.join(root, rel), "rb") as fh:
                compile(fh.read(), rel, "exec")
            compiled += 1
        except (SyntaxError, ValueError, OSError) as exc:
            fail(f"compile {rel}: {exc}")
    if kernel_sources:
        print(f"ok   kernels: {compiled} of {len(kernel_sources)} sources compile")
        if importlib.util.find_spec("torch") is None:
            print("skip import kernels: torch is not installed in this image (the import test runs only where "
                  "torch is, e.g. on the real fleet's image)")
        else:
            sys.path.insert(0, root)
            try:
                importlib.import_module("kernels")
                print("ok   import kernels")
            except BaseException as exc:
                fail(f"import kernels: {traceback.format_exception_only(type(exc), exc)[-1].strip()}")

    print(f"selftest: {'FAILED, ' + str(len(failures)) + ' problem(s)' if failures else 'passed'} "
          f"(bundle {str(manifest.get('bundle'))[:12]})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
