#!/usr/bin/python3
"""Stand-in for nvidia-container-runtime-hook on a testbed host with a real dockerd (engine `docker`).

dockerd registers its `--gpus` device driver only when it finds this name on its PATH; for a container
started with `--gpus all` it adds `nvidia-container-runtime-hook prestart` as an OCI prestart hook. runc runs
the hook after it has mounted the container's filesystems and before pivot_root, with the container's
state (pid, bundle) on stdin. The real hook mounts the driver's files and the GPU's device nodes into the
container; there is no GPU here, so this one gives the container what a GB10 would show it and what the
rank simulator reads in place of a GPU (docs/testbed.md "Real engine"):

- /sys/class: the host's view (the RoCE HCAs' GID tables under /sys/class/infiniband, dmi/id);
- /proc/driver/nvidia (the driver version) and /proc/meminfo (the unified memory of the host);
- /.testbed, read-only: the host's testbed facts (GPU stand-in state, nvidia-smi polls, desktop);
- /.testbed-engine.sock (a file target): the host's Docker API socket (/var/run/docker.sock, where the host's
  dockerd listens: testbed/tb/engine.py). It is the testbed's way for the model of GPU contention to know what
  else runs on the node: the rank simulator counts the host's running, non-serving containers there (0.15 ms a
  step each; testbed/engine/sim.py contention_ms), as a real GPU feels them. The real hook binds no such socket,
  and no role reads it.

Every call is logged to /run/testbed/nvidia-hook.log (one JSON line) for the tests.
"""
import json
import os
import subprocess
import sys
import time

LOG = "/run/testbed/nvidia-hook.log"


def main() -> int:
    verb = sys.argv[1] if len(sys.argv) > 1 else ""
    if verb != "prestart":
        # poststart/poststop and `--version` are no-ops for the real hook too.
        return 0
    state = json.load(sys.stdin)
    pid, bundle = state["pid"], state["bundle"]
    with open(os.path.join(bundle, "config.json")) as fh:
        config = json.load(fh)
    root = config["root"]["path"]
    if not os.path.isabs(root):
        root = os.path.join(bundle, root)
    env = dict(item.split("=", 1) for item in config.get("process", {}).get("env", []) if "=" in item)
    binds = [("/sys/class", "sys/class", True), ("/proc/driver", "proc/driver", False),
             ("/run/testbed/meminfo", "proc/meminfo", False), ("/run/testbed", ".testbed", False),
             ("/var/run/docker.sock", ".testbed-engine.sock", False)]
    done = []
    for source, target, recursive in binds:
        if not os.path.exists(source):
            continue
        dest = os.path.join(root, target)
        script = ("set -e; [ -e \"$2\" ] || { if [ -d \"$1\" ]; then mkdir -p \"$2\"; else : > \"$2\"; fi; }; "
                  "mount \"$3\" \"$1\" \"$2\"")
        proc = subprocess.run(["nsenter", "-t", str(pid), "-m", "--", "sh", "-c", script, "hook", source, dest,
                               "--rbind" if recursive else "--bind"], capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"nvidia-container-runtime-hook (testbed): mount {source} on {dest}: {proc.stderr.strip()}",
                  file=sys.stderr)
            return 1
        done.append(target)
    if os.path.isdir("/run/testbed"):
        with open(LOG, "a") as fh:
            fh.write(json.dumps({"time": time.time(), "id": state.get("id"), "pid": pid,
                                 "visible_devices": env.get("NVIDIA_VISIBLE_DEVICES"), "mounted": done}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
