"""Paths, errors and small process helpers shared by the testbed's parts (controller side)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTBED = REPO / "testbed"
# Inside every host the repository's testbed/ folder is visible read-only here.
HOST_TESTBED = "/usr/lib/sparkfleet-testbed"
SUBNET = "10.213.0"
CONTROLLER_ADDR = f"{SUBNET}.254"
CONTROL_NS = "fleetctl"
CONTROL_PATH_DIR = "/tmp/sparkfleet-cp"


class TestbedError(Exception):
    """A problem the operator can act on; printed as one line, never as a traceback."""


def log(msg: str) -> None:
    print(f"testbed: {msg}", file=sys.stderr, flush=True)


def run(argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, text=True, capture_output=True, **kw)
    if check and proc.returncode != 0:
        raise TestbedError(f"`{' '.join(argv)}` failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}")
    return proc


def host_name(index: int) -> str:
    return f"spark{index}"


def host_addr(index: int) -> str:
    return f"{SUBNET}.{10 + index}"


@dataclass(frozen=True)
class Layout:
    """Where the testbed keeps its state on the controller."""
    state_dir: Path

    @classmethod
    def from_env(cls) -> "Layout":
        return cls(Path(os.environ.get("SPARKFLEET_TESTBED_STATE", REPO / ".testbed")).resolve())

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def ssh_dir(self) -> Path:
        return self.state_dir / "ssh"

    @property
    def checkpoint_dir(self) -> Path:
        return self.state_dir / "checkpoint"

    def host_dir(self, host: str) -> Path:
        return self.state_dir / "hosts" / host

    def read_state(self) -> dict | None:
        try:
            return json.loads(self.state_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def write_state(self, state: dict) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, self.state_file)
