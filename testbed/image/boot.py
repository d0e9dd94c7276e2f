"""The recipe's boot script (testbed copy): `run` starts this node's rank, `health` is the healthcheck.
In the testbed the engine behind it is the simulator baked into the base image (/opt/sglang-sim)."""
import sys

sys.path.insert(0, "/opt/sglang-sim")
from engine import sim  # noqa: E402

if __name__ == "__main__":
    sys.exit(sim.main(sys.argv[1:]))
