#!/usr/bin/python3
"""Stand-in for `nvidia-smi` on a testbed host: one NVIDIA GB10 whose state (clock limits, driver) is
kept per host in /run/testbed/gpu.json (tmpfs: like the real GPU, a lock does not survive a reboot).

Supported: plain table, -L, --query-gpu=FIELDS --format=csv[,noheader][,nounits], -q [-d CLOCK],
-lgc/--lock-gpu-clocks MIN,MAX, -rgc/--reset-gpu-clocks, -i 0. Every call is appended to
/run/testbed/nvidia-smi.log so the engine simulator can feel a dashboard's polling.
"""
import json
import os
import sys
import time

STATE = "/run/testbed/gpu.json"
DEFAULT = {"name": "NVIDIA GB10", "driver_version": "580.159.03", "cuda_version": "13.0",
           "pci_bus_id": "00000000:01:00.0", "uuid": "GPU-5f3e2c1a-9b7d-4e21-a0c4-7d2b8e6f1a90",
           "max_sm_mhz": 3003, "min_sm_mhz": 0, "idle_sm_mhz": 208, "locked": None,
           "memory_total_mib": 124_586, "open_kernel_module": True, "vbios": "99.01.2C.00.01"}


def load() -> dict:
    try:
        with open(STATE) as fh:
            return {**DEFAULT, **json.load(fh)}
    except (FileNotFoundError, json.JSONDecodeError):
        return dict(DEFAULT)


def save(state: dict) -> None:
    os.makedirs(os.path.dirname(STATE), exist_ok=True)
    tmp = STATE + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(state, fh)
    os.replace(tmp, STATE)


def sm_clock(state: dict) -> int:
    return min(state["idle_sm_mhz"], state["locked"][1]) if state["locked"] else state["idle_sm_mhz"]


def field(state: dict, name: str, units: bool) -> str:
    mhz = " MHz" if units else ""
    mib = " MiB" if units else ""
    locked = state["locked"]
    values = {
        "name": state["name"], "gpu_name": state["name"], "driver_version": state["driver_version"],
        "pci.bus_id": state["pci_bus_id"], "uuid": state["uuid"], "index": "0", "count": "1",
        "vbios_version": state["vbios"],
        "clocks.sm": f"{sm_clock(state)}{mhz}", "clocks.current.sm": f"{sm_clock(state)}{mhz}",
        "clocks.gr": f"{sm_clock(state)}{mhz}", "clocks.current.graphics": f"{sm_clock(state)}{mhz}",
        "clocks.max.sm": f"{state['max_sm_mhz']}{mhz}", "clocks.max.graphics": f"{state['max_sm_mhz']}{mhz}",
        "clocks.max.gr": f"{state['max_sm_mhz']}{mhz}",
        "clocks.mem": "[N/A]", "clocks.max.mem": "[N/A]",
        "clocks_event_reasons.applications_clocks_setting": "Active" if locked else "Not Active",
        "clocks_throttle_reasons.applications_clocks_setting": "Active" if locked else "Not Active",
        "memory.total": "[N/A]", "memory.used": "[N/A]", "memory.free": "[N/A]",
        "temperature.gpu": "41", "power.draw": f"11.52{' W' if units else ''}", "utilization.gpu": f"0{' %' if units else ''}",
        "persistence_mode": "Enabled", "pstate": "P8", "compute_mode": "Default",
    }
    if name not in values:
        raise KeyError(name)
    return values[name]


def query(state: dict, fields: list[str], fmt: str) -> int:
    opts = set(fmt.split(","))
    if "csv" not in opts:
        print("Invalid format specified; csv is the only format the testbed stand-in supports.", file=sys.stderr)
        return 2
    units = "nounits" not in opts
    try:
        row = [field(state, f.strip(), units) for f in fields]
    except KeyError as exc:
        print(f'Field "{exc.args[0]}" is not a valid field to query.', file=sys.stderr)
        return 2
    if "noheader" not in opts:
        print(", ".join(f.strip() + (" [MHz]" if units and f.strip().startswith("clocks.") and
                                     "reasons" not in f else "") for f in fields))
    print(", ".join(row))
    return 0


def table(state: dict) -> None:
    print(time.strftime("%a %b %d %H:%M:%S %Y"))
    print("+-----------------------------------------------------------------------------------------+")
    print(f"| NVIDIA-SMI {state['driver_version']}             Driver Version: {state['driver_version']}     CUDA Version: {state['cuda_version']}     |")
    print("|-----------------------------------------+------------------------+----------------------+")
    print(f"|   0  {state['name']:<26}On  |   {state['pci_bus_id'][4:]} Off |                  N/A |")
    print(f"| N/A   41C    P8             11W /  N/A  | Not Supported          |      0%      Default |")
    print("+-----------------------------------------+------------------------+----------------------+")


def query_clock(state: dict) -> None:
    locked = state["locked"]
    print(f"\n==============NVSMI LOG==============\n\nDriver Version                            : {state['driver_version']}")
    print(f"\nGPU {state['pci_bus_id']}")
    print("    Clocks")
    print(f"        Graphics                          : {sm_clock(state)} MHz")
    print(f"        SM                                : {sm_clock(state)} MHz")
    print("        Memory                            : N/A")
    print("    Max Clocks")
    print(f"        Graphics                          : {state['max_sm_mhz']} MHz")
    print(f"        SM                                : {state['max_sm_mhz']} MHz")
    print("    Clocks Event Reasons")
    print(f"        Applications Clocks Setting       : {'Active' if locked else 'Not Active'}")
    print("    Locked Clocks")
    print(f"        Min                               : {f'{locked[0]} MHz' if locked else 'N/A'}")
    print(f"        Max                               : {f'{locked[1]} MHz' if locked else 'N/A'}")


def main(argv: list[str]) -> int:
    try:
        with open("/run/testbed/nvidia-smi.log", "a") as fh:
            fh.write(f"{time.time():.3f} {' '.join(argv)}\n")
    except OSError:
        pass
    state = load()
    args = [a for a in argv if a not in ("-i", "0", "--id=0")]
    if not args:
        table(state)
        return 0
    first = args[0]
    if first == "-L":
        print(f"GPU 0: {state['name']} (UUID: {state['uuid']})")
        return 0
    if first.startswith("--query-gpu="):
        fmt = next((a.split("=", 1)[1] for a in args if a.startswith("--format=")), "")
        return query(state, first.split("=", 1)[1].split(","), fmt)
    if first in ("-lgc", "--lock-gpu-clocks") or first.startswith("--lock-gpu-clocks="):
        value = first.split("=", 1)[1] if "=" in first else (args[1] if len(args) > 1 else "")
        try:
            lo, hi = (int(v) for v in value.split(","))
        except ValueError:
            print(f'Invalid combination of input arguments. Please run "nvidia-smi -h" for help.', file=sys.stderr)
            return 2
        if os.geteuid() != 0:
            print("Insufficient Permissions", file=sys.stderr)
            return 4
        if lo < 0 or hi < lo or hi > state["max_sm_mhz"]:
            print(f"Specified clock range ({lo}, {hi}) is not valid; the GPU supports 0 to {state['max_sm_mhz']} MHz.",
                  file=sys.stderr)
            return 2
        state["locked"] = [lo, hi]
        save(state)
        print(f'GPU clocks set to "(gpuClkMin {lo}, gpuClkMax {hi})" for GPU {state["pci_bus_id"]}')
        print("All done.")
        return 0
    if first in ("-rgc", "--reset-gpu-clocks"):
        if os.geteuid() != 0:
            print("Insufficient Permissions", file=sys.stderr)
            return 4
        state["locked"] = None
        save(state)
        print(f"All done.")
        return 0
    if first in ("-q", "--query"):
        query_clock(state)
        return 0
    print(f'Invalid combination of input arguments. Please run "nvidia-smi -h" for help.', file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
