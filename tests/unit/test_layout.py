"""Issue 25 items 1 and 2: one home per kind of plugin, no symlinks, host-side code shipped from module_utils."""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def tracked() -> list[tuple[str, str]]:
    out = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return [(line.split()[0], line.split("\t", 1)[1]) for line in out.splitlines()]


def test_the_tree_holds_no_symlink():
    assert [path for mode, path in tracked() if mode == "120000"] == []
    untracked = subprocess.run(["git", "ls-files", "--others", "--exclude-standard"], cwd=ROOT, check=True,
                               capture_output=True, text=True).stdout.split()
    assert [p for p in untracked if (ROOT / p).is_symlink()] == []


def test_plugins_have_one_home_each():
    paths = [p for _, p in tracked()]
    assert [p for p in paths if p.startswith("roles/") and ("/library/" in p or "/filter_plugins/" in p
                                                             or "/module_utils/" in p)] == []


def test_host_side_code_is_copied_from_module_utils_and_no_role_keeps_a_copy():
    sources = {hashlib.sha256(p.read_bytes()).hexdigest(): p.name for p in (ROOT / "module_utils").glob("*.py")}
    copies = [str(p.relative_to(ROOT)) for p in ROOT.glob("roles/*/files/**/*")
              if p.is_file() and hashlib.sha256(p.read_bytes()).hexdigest() in sources]
    assert copies == []
    install = yaml.safe_load((ROOT / "roles/bench_client/tasks/install.yml").read_text())
    ship = next(t for t in install if t["name"] == "Ship the client from the controller")
    assert ship["ansible.builtin.copy"]["src"].endswith("/../../module_utils/{{ item }}")
    assert all((ROOT / "module_utils" / name).is_file() for name in ship["loop"])
