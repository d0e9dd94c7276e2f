#!/usr/bin/python3
"""Stand-in for the operators' GPU dashboard: polls nvidia-smi every POLL_MS milliseconds
(/etc/default/gpu-dashboard), like the dashboard docs/reference.md section 6 warns about."""
import subprocess
import time


def poll_ms() -> int:
    try:
        for line in open("/etc/default/gpu-dashboard"):
            if line.strip().startswith("POLL_MS="):
                return max(100, int(line.split("=", 1)[1].strip().strip('"')))
    except (FileNotFoundError, ValueError):
        pass
    return 2000


while True:
    subprocess.run(["/usr/bin/nvidia-smi", "--query-gpu=utilization.gpu,clocks.sm,temperature.gpu,power.draw",
                    "--format=csv,noheader"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(poll_ms() / 1000)
