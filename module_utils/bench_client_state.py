# -*- coding: utf-8 -*-
"""Is the decode benchmark's client on a host already the one this controller would install?

roles/bench_client installs the client once per run and host (six Ansible turns: the Python version, the venv, its
folder, the three files, the launcher, a ``--help`` run). A campaign runs every rung as its own run, so every rung
installed it again over an identical copy (about 3.5 s a rung on the testbed; docs/campaign.md). One read instead:

- on the host (this file run by the host's Python: ``python3 -c <this file> VENV NAME...``, standard
  library only): ``read(venv, names)`` prints the host's Python version, a digest of each installed file
  and whether the installed launcher runs (``--help``, exit 0), as one JSON line; it changes nothing;
- on the controller: ``expected(module_utils_dir, names, launcher_text)`` is the same digests of what the role
  would ship, and ``current(read_stdout, expected)`` decides. The client counts as current only when the Python is
  3.9 or newer, every file is there with the digest of the controller's copy and the launcher runs; anything else
  (no venv, a file missing or different, an unreadable answer) installs as before.

A digest is the SHA-256 of the text without trailing whitespace (Ansible's file lookup and template rendering
differ only there). Unit-tested in tests/unit/test_bench_client_state.py.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

MIN_PYTHON = (3, 9)
LAUNCHER_KEY = "bin/sparkfleet-bench"


def digest(text) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return hashlib.sha256(str(text).rstrip().encode("utf-8")).hexdigest()


def _file_digest(path: str):
    try:
        with open(path, "rb") as handle:
            return digest(handle.read())
    except OSError:
        return None


def read(venv: str, names: list) -> dict:
    """{python, files: {name or LAUNCHER_KEY: digest or None}, runs} of the client installed under ``venv``."""
    files = {name: _file_digest(os.path.join(venv, "lib", "sparkfleet-bench", name)) for name in names}
    launcher = os.path.join(venv, "bin", "sparkfleet-bench")
    files[LAUNCHER_KEY] = _file_digest(launcher)
    runs = False
    if all(value is not None for value in files.values()):
        try:
            runs = subprocess.run([launcher, "--help"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  timeout=60).returncode == 0
        except (OSError, subprocess.SubprocessError):
            runs = False
    return {"python": "%d.%d" % sys.version_info[:2], "files": files, "runs": runs}


def expected(module_utils_dir: str, names: list, launcher_text: str) -> dict:
    """{name: digest} of the files the role ships from ``module_utils_dir`` and of its rendered launcher."""
    out = {}
    for name in names:
        with open(os.path.join(module_utils_dir, name), "rb") as handle:
            out[name] = digest(handle.read())
    out[LAUNCHER_KEY] = digest(launcher_text)
    return out


def current(read_stdout, wanted: dict) -> bool:
    """True only when the host's client is exactly the one the role would install and it runs."""
    try:
        state = json.loads(read_stdout or "")
    except (TypeError, ValueError):
        return False
    if not isinstance(state, dict) or not isinstance(wanted, dict) or not wanted:
        return False
    try:
        python = tuple(int(part) for part in str(state.get("python", "")).split(".")[:2])
    except ValueError:
        return False
    files = state.get("files")
    return (len(python) == 2 and python >= MIN_PYTHON and state.get("runs") is True and isinstance(files, dict)
            and all(files.get(name) == value for name, value in wanted.items()))


if __name__ == "__main__":
    print(json.dumps(read(sys.argv[1], sys.argv[2:])))
