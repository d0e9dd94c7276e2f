#!/usr/bin/env python3
"""Check that every collection requirements.yml pins is installed at exactly its pinned version, where Ansible
finds it first (`make venv` runs this; tests/unit/test_collections.py too).

The collections come from PyPI's `ansible` package (requirements.txt): Galaxy is not reachable from the testbed
machine or CI. A collection found first in another path (ANSIBLE_HOME/collections, ~/.ansible/collections)
shadows the package's copy, so the check follows Ansible's own search order (`ansible-galaxy collection list`).

    python tests/lint/check_collections.py [requirements.yml]    # exit 0, or 1 with one line per problem
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def pins(path: Path) -> dict:
    data = yaml.safe_load(path.read_text()) or {}
    out = {}
    for item in data.get("collections") or []:
        if not isinstance(item, dict) or not item.get("name") or not item.get("version"):
            raise SystemExit(f"{path}: every collection needs a name and an exact version, got {item!r}")
        out[str(item["name"])] = str(item["version"])
    return out


def installed(galaxy: str) -> dict:
    """{name: (version, path)} of the copy Ansible uses: the first search path that holds the collection."""
    proc = subprocess.run([galaxy, "collection", "list", "--format", "json"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{galaxy} collection list failed (rc={proc.returncode}): {proc.stderr.strip()[-400:]}")
    found: dict = {}
    for path, collections in json.loads(proc.stdout or "{}").items():
        for name, info in collections.items():
            found.setdefault(name, (str(info.get("version")), path))
    return found


def problems(wanted: dict, have: dict) -> list:
    out = []
    for name, version in sorted(wanted.items()):
        if name not in have:
            out.append(f"{name} {version} is not installed: run `make venv` (requirements.txt pins the `ansible` "
                       f"package that carries it)")
        elif have[name][0] != version:
            out.append(f"{name} is {have[name][0]} in {have[name][1]}, but requirements.yml pins {version}: "
                       "remove that copy or change the pins in requirements.yml and requirements.txt together")
    return out


def main(argv: list) -> int:
    path = Path(argv[1]) if len(argv) > 1 else ROOT / "requirements.yml"
    galaxy = os.environ.get("ANSIBLE_GALAXY") or str(Path(sys.executable).parent / "ansible-galaxy")
    found = problems(pins(path), installed(galaxy))
    for line in found:
        print(f"collections: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
