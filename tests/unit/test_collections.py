"""Issue 22 item 4: community.docker comes from PyPI's `ansible` package (requirements.txt), pinned in
requirements.yml; `make venv` checks the installed version (tests/lint/check_collections.py)."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("check_collections", ROOT / "tests/lint/check_collections.py")
cc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cc)

PKG = ".venv/lib/python3.11/site-packages/ansible_collections"


def test_requirements_pin_the_package_and_the_collection_versions():
    txt = (ROOT / "requirements.txt").read_text()
    assert re.search(r"^ansible==12\.3\.0$", txt, re.M) and re.search(r"^ansible-core==2\.19\.\d+$", txt, re.M)
    pins = cc.pins(ROOT / "requirements.yml")
    assert pins["community.docker"] == "4.8.5"


def test_the_installed_collections_are_the_pinned_ones():
    galaxy = str(Path(sys.executable).parent / "ansible-galaxy")
    assert cc.problems(cc.pins(ROOT / "requirements.yml"), cc.installed(galaxy)) == []


def test_a_missing_or_shadowing_collection_is_named_with_what_to_do():
    wanted = {"community.docker": "4.8.5", "community.general": "11.0.0"}
    have = {"community.docker": ("3.4.0", "/root/.ansible/collections/ansible_collections")}
    assert cc.problems(wanted, have) == [
        "community.docker is 3.4.0 in /root/.ansible/collections/ansible_collections, but requirements.yml pins "
        "4.8.5: remove that copy or change the pins in requirements.yml and requirements.txt together",
        "community.general 11.0.0 is not installed: run `make venv` (requirements.txt pins the `ansible` package "
        "that carries it)"]


def test_the_first_path_in_ansibles_search_order_wins(tmp_path):
    listing = {"/root/.ansible/collections/ansible_collections": {"community.docker": {"version": "3.4.0"}},
               PKG: {"community.docker": {"version": "4.8.5"}}}
    fake = tmp_path / "ansible-galaxy"
    fake.write_text("#!/bin/sh\necho '" + json.dumps(listing) + "'\n")
    fake.chmod(0o755)
    assert cc.installed(str(fake))["community.docker"] == ("3.4.0", "/root/.ansible/collections/ansible_collections")


def test_the_check_fails_with_the_message_for_a_wrong_pin(tmp_path):
    req = tmp_path / "requirements.yml"
    req.write_text(yaml.safe_dump({"collections": [{"name": "community.docker", "version": "4.0.0"}]}))
    proc = subprocess.run([sys.executable, str(ROOT / "tests/lint/check_collections.py"), str(req)],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert "collections: community.docker is 4.8.5 in " in proc.stderr and "requirements.yml pins 4.0.0" in proc.stderr
