"""Shared pytest setup: make the project's module_utils importable as ``ansible.module_utils.<name>``
(exactly how Ansible resolves them inside a module) and expose the repository root."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import ansible.module_utils

ROOT = Path(__file__).resolve().parent.parent
_MU = str(ROOT / "module_utils")
if _MU not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MU)


def load_module(name: str):
    """Import ``library/<name>.py`` as a Python module for in-process tests."""
    spec = importlib.util.spec_from_file_location(f"sparkfleet_library_{name}", ROOT / "library" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
