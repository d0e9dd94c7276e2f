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
# Several testbeds can live side by side (one per developer checkout): SPARKFLEET_TESTBED_ID=k (1..9)
# gives namespaces tb<k>-spark1.. and tb<k>-fleetctl on 10.213.<k>.0/24; the default (0) is spark1..,
# fleetctl and 10.213.0.0/24.
TESTBED_ID = int(os.environ.get("SPARKFLEET_TESTBED_ID", "0") or 0)
NS_PREFIX = f"tb{TESTBED_ID}-" if TESTBED_ID else ""
SUBNET = f"10.213.{TESTBED_ID}"
CONTROLLER_ADDR = f"{SUBNET}.254"
CONTROL_NS = f"{NS_PREFIX}fleetctl"
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


def ns_name(host: str) -> str:
    return f"{NS_PREFIX}{host}"


def host_addr(index: int) -> str:
    return f"{SUBNET}.{10 + index}"


@dataclass(frozen=True)
class Layout:
    """Where the testbed keeps its state on the controller."""
    state_dir: Path

    @classmethod
    def from_env(cls) -> "Layout":
        default = REPO / (f".testbed-{TESTBED_ID}" if TESTBED_ID else ".testbed")
        return cls(Path(os.environ.get("SPARKFLEET_TESTBED_STATE", default)).resolve())

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
