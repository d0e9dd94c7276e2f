"""node_preflight_info (and its deprecated alias node_preflight): every check's verdict on realistic host state (procfs, sysfs GID tables, ip -j, nvidia-smi,
journalctl), bad input, the module's result, and the parity filter of roles/preflight."""
from __future__ import annotations

import functools
import importlib.util
import ipaddress
import json
import os
from pathlib import Path

import pytest

from ansible.module_utils import node_preflight as np
from tests.conftest import ROOT, load_module
from tests.unit.module_harness import run_module

FIX = Path(__file__).parent / "fixtures" / "preflight"
GOOD = dict(allowed_kernels=("7.0.0-1019-nvidia",), kho_kernels=("7.0.0-*-nvidia",),
            allowed_drivers=("580.159.03-open",), fabric_address="192.168.100.12",
            fabric_interfaces=("enp1s0f0np0",), min_shm_gib=0.001, image="dsv41-3x-spark:local")


def gid_rows(address: str, extra_pairs: int = 0) -> list:
    link_local = "fe80:0000:0000:0000:4ebb:47ff:fe2e:1003"
    rows = [(link_local, "IB/RoCE v1"), (link_local, "RoCE v2")]
    for n in range(extra_pairs):
        g = ipaddress.IPv6Address(f"fd00:100::12:{n + 1}").exploded
        rows += [(g, "IB/RoCE v1"), (g, "RoCE v2")]
    v4 = ipaddress.IPv6Address("::ffff:" + address).exploded
    return rows + [(v4, "IB/RoCE v1"), (v4, "RoCE v2")]


class Host:
    """A node's procfs/sysfs view in a temporary folder, plus canned command output."""

    def __init__(self, root: Path):
        self.root = root
        self.files = {
            "osrelease": "7.0.0-1019-nvidia\n", "cmdline": (FIX / "cmdline.kho_off").read_text(),
            "buddyinfo": (FIX / "buddyinfo.healthy").read_text(), "meminfo": (FIX / "meminfo.gb10").read_text(),
            "vmstat": (FIX / "vmstat").read_text(), "swaps": (FIX / "swaps.none").read_text(),
            "nvidia_version": (FIX / "nvidia_version.open").read_text(), "bios_version": "5.36_0ACUM018\n",
        }
        self.commands = {
            "ip": (0, (FIX / "ip_addr.json").read_text(), ""),
            "nvidia-smi": (0, (FIX / "nvidia_smi_clock.locked").read_text(), ""),
            "journal_0": (0, (FIX / "journal.clean").read_text(), ""),
            "journal_1": (0, (FIX / "journal.clean").read_text(), ""),
            "docker": (0, json.dumps([{"Id": "sha256:" + "ab" * 32, "Config": {
                "Env": ["PATH=/usr/bin", "NCCL_VERSION=2.27.7-1"], "Labels": {}}}]), ""),
        }
        self.hcas = {"rocep1s0f0": ("enp1s0f0np0", gid_rows("192.168.100.12")),
                     "rocep1s0f1": ("enp1s0f1np1", gid_rows("192.168.101.12")[:2])}
        self.processes = {}      # pid -> (comm, same mount namespace)
        self.calls = []

    def paths(self) -> np.Paths:
        r = self.root
        for name, text in self.files.items():
            if text is not None:
                (r / name).write_text(text)
        ib = r / "infiniband"
        for hca, (ndev, rows) in self.hcas.items():
            port = ib / hca / "ports" / "1"
            (port / "gids").mkdir(parents=True, exist_ok=True)
            (port / "gid_attrs" / "types").mkdir(parents=True, exist_ok=True)
            (port / "gid_attrs" / "ndevs").mkdir(parents=True, exist_ok=True)
            (ib / hca / "fw_ver").write_text("28.45.1200\n")
            for index in range(16):
                gid, gtype = rows[index] if index < len(rows) else (np.ZERO_GID, None)
                (port / "gids" / str(index)).write_text(gid + "\n")
                if gtype:   # unused entries: attributes unreadable (EINVAL on a real HCA)
                    (port / "gid_attrs" / "types" / str(index)).write_text(gtype + "\n")
                    (port / "gid_attrs" / "ndevs" / str(index)).write_text(ndev + "\n")
        proc = r / "proc"
        (proc / "self" / "ns").mkdir(parents=True, exist_ok=True)
        if not (proc / "self" / "ns" / "mnt").is_symlink():
            os.symlink("mnt:[4026531841]", proc / "self" / "ns" / "mnt")
        for pid, (comm, same_ns) in self.processes.items():
            (proc / str(pid) / "ns").mkdir(parents=True, exist_ok=True)
            (proc / str(pid) / "comm").write_text(comm + "\n")
            os.symlink("mnt:[4026531841]" if same_ns else "mnt:[4026532999]", proc / str(pid) / "ns" / "mnt")
        return np.Paths(cmdline=str(r / "cmdline"), osrelease=str(r / "osrelease"), buddyinfo=str(r / "buddyinfo"),
                        meminfo=str(r / "meminfo"), vmstat=str(r / "vmstat"), swaps=str(r / "swaps"),
                        nvidia_version=str(r / "nvidia_version"), infiniband=str(ib),
                        bios_version=str(r / "bios_version"), shm=str(r), proc=str(proc))

    def run(self, argv: list) -> tuple:
        self.calls.append(argv)
        if argv[0] == "journalctl":
            key = "journal_0" if argv[argv.index("-b") + 1] == "0" else "journal_1"
        else:
            key = argv[0]
        result = self.commands[key]
        if isinstance(result, Exception):
            raise result
        return result


@pytest.fixture
def node(tmp_path):
    return Host(tmp_path)


def preflight(host: Host, **overrides) -> dict:
    request = np.Request(**{**GOOD, **overrides})
    return np.preflight(request, host.paths(), host.run)


def checks(result: dict) -> dict:
    return {c["name"]: c for c in result["checks"]}


def test_a_healthy_node_passes_every_check_and_says_start(node):
    result = preflight(node)
    assert result["verdict"] == "start" and result["ok"] is True
    assert result["failed_checks"] == [] and result["warned_checks"] == []
    assert [c["name"] for c in result["checks"]] == list(np.CHECKS)
    assert all(c["status"] == "pass" for c in result["checks"])
    c = checks(result)
    assert c["gid"]["facts"]["hcas"] == {"rocep1s0f0": {"port": 1, "index": 3, "ndev": "enp1s0f0np0",
                                                        "gid": "0000:0000:0000:0000:0000:ffff:c0a8:640c"}}
    assert c["fragmentation"]["facts"]["gate"] == "start"
    assert c["fragmentation"]["facts"]["high_order_blocks"] == 29380 + 380
    assert c["fragmentation"]["facts"]["compaction"] == {"compact_stall": 14, "compact_fail": 9, "compact_success": 5}
    assert result["parity"] == {
        "kernel": "7.0.0-1019-nvidia", "driver": "580.159.03-open",
        "firmware": "bios 5.36_0ACUM018; rocep1s0f0 28.45.1200; rocep1s0f1 28.45.1200", "nccl": "2.27.7-1",
        "image": np.image_identity(json.loads(node.commands["docker"][1])[0]), "image_id": "sha256:abababababab",
        "swap": "off", "clocks": "0-2200 MHz", "fragmentation": "start", "gid_index": "rocep1s0f0:3", "kho": "off"}
    assert result["parity"]["image"].startswith("config:")
    # One call per source; the journal of both boots is read.
    assert sorted(a[0] for a in node.calls) == ["docker", "ip", "journalctl", "journalctl", "nvidia-smi"]


@pytest.mark.parametrize("cmdline,meminfo,release,status,text", [
    ("cmdline.no_kho", "meminfo.gb10", "7.0.0-1019-nvidia", "fail", "has no kho=off"),
    ("cmdline.kho_off", "meminfo.kho_active", "7.0.0-1019-nvidia", "fail", "CmaFree (9503744 kB) is above CmaTotal"),
    ("cmdline.no_kho", "meminfo.gb10", "6.17.0-1008-nvidia", "pass", "does not need kho=off"),
    ("cmdline.kho_off", "meminfo.gb10", "7.0.0-1019-nvidia", "pass", "kho=off is on the command line"),
])
def test_kho_needs_kho_off_on_kernels_that_enable_handover_and_a_sane_cma(node, cmdline, meminfo, release, status,
                                                                         text):
    node.files.update(cmdline=(FIX / cmdline).read_text(), meminfo=(FIX / meminfo).read_text(),
                      osrelease=release + "\n")
    result = preflight(node, allowed_kernels=("7.0.0-1019-nvidia", "6.17.0-1008-nvidia"))
    kho = checks(result)["kho"]
    assert kho["status"] == status and text in kho["summary"]
    assert result["failed_checks"] == (["kho"] if status == "fail" else [])
    if status == "fail":
        assert "kho=off" in kho["fix"] and "update-grub" in kho["fix"]


def test_kho_zero_counts_as_off(node):
    node.files["cmdline"] = (FIX / "cmdline.no_kho").read_text().strip() + " kho=0\n"
    assert checks(preflight(node))["kho"]["status"] == "pass"


def test_an_unlisted_kernel_fails_and_a_glob_allows_it(node):
    node.files["osrelease"] = "7.0.0-1023-nvidia\n"
    result = preflight(node)
    assert result["failed_checks"] == ["kernel"]
    assert "7.0.0-1023-nvidia is not in preflight_allowed_kernels" in checks(result)["kernel"]["summary"]
    assert preflight(node, allowed_kernels=("7.0.0-10*-nvidia",))["ok"]


def test_the_driver_flavour_matters(node):
    node.files["nvidia_version"] = (FIX / "nvidia_version.proprietary").read_text()
    result = preflight(node)
    assert result["failed_checks"] == ["driver"]
    assert "proprietary kernel module" in checks(result)["driver"]["summary"]
    assert preflight(node, allowed_drivers=("580.159.03-proprietary",))["ok"]


def test_without_the_proc_file_the_driver_comes_from_nvidia_smi_and_its_flavour_is_unknown(node):
    node.files["nvidia_version"] = None
    driver = checks(preflight(node))["driver"]
    assert driver["status"] == "fail" and driver["facts"]["version"] == "580.159.03"
    assert "flavour unknown" in driver["summary"]


def test_fragmentation_says_reboot_first_when_no_large_block_is_free(node):
    node.files["buddyinfo"] = (FIX / "buddyinfo.fragmented").read_text()
    result = preflight(node)
    frag = checks(result)["fragmentation"]
    assert result["failed_checks"] == ["fragmentation"] and result["verdict"] == "reboot first"
    assert frag["facts"]["gate"] == "reboot first" and frag["facts"]["high_order_blocks"] == 0
    assert "only 0.0 GiB free in blocks of order >= 10 (4 MiB+)" in frag["summary"]
    assert "compaction stalls 14, failures 9" in frag["summary"]
    assert "reboot" in frag["fix"]
    # A lower order counts the 512 KiB..1 MiB blocks: 830 blocks of order 7 are 0.4 GiB, still short of 16 GiB.
    assert preflight(node, min_order=7)["verdict"] == "reboot first"
    assert preflight(node, min_order=3, min_high_order_gib=1)["ok"]


def test_page_cache_is_a_warning_that_names_drop_caches(node):
    node.files["meminfo"] = (FIX / "meminfo.page_cache").read_text()
    result = preflight(node)
    assert result["ok"] and result["warned_checks"] == ["fragmentation"]
    assert "drop_caches" in checks(result)["fragmentation"]["fix"]


def test_an_order_the_kernel_does_not_have_is_bad_input(node):
    with pytest.raises(np.PreflightError, match="preflight_min_order=11 but /proc/buddyinfo on this node has orders 0..10"):
        preflight(node, min_order=11)


def _ip(edit) -> str:
    links = json.loads((FIX / "ip_addr.json").read_text())
    edit({l["ifname"]: l for l in links})
    return json.dumps(links)


def test_fabric_mtu_1500_fails_only_the_fabric_check(node):
    node.commands["ip"] = (0, _ip(lambda l: l["enp1s0f0np0"].update(mtu=1500)), "")
    result = preflight(node)
    assert result["failed_checks"] == ["fabric"]
    fabric = checks(result)["fabric"]
    assert "enp1s0f0np0 has MTU 1500, not 9000" in fabric["summary"]
    assert "ip link set dev enp1s0f0np0 mtu 9000" in fabric["fix"] and "netplan" in fabric["fix"]


def test_fabric_down_and_missing_interfaces(node):
    node.commands["ip"] = (0, _ip(lambda l: l["enp1s0f0np0"].update(flags=["BROADCAST", "MULTICAST", "UP"],
                                                                     operstate="DOWN")), "")
    assert "enp1s0f0np0 is down" in checks(preflight(node))["fabric"]["summary"]
    result = preflight(node, fabric_interfaces=("enp1s0f0np0", "enP2p1s0f0np0"))
    assert "fabric interface enP2p1s0f0np0 does not exist" in checks(result)["fabric"]["summary"]


def test_a_fabric_address_no_interface_holds_fails_fabric_and_gid(node):
    result = preflight(node, fabric_address="192.168.100.99")
    assert result["failed_checks"] == ["fabric", "gid"]
    c = checks(result)
    assert "no interface holds the fabric address 192.168.100.99" in c["fabric"]["summary"]
    assert "fleet_fabric_address" in c["fabric"]["fix"]
    assert "no RoCE v2 GID for ::ffff:192.168.100.99 on rocep1s0f0" in c["gid"]["summary"]


def test_the_fabric_address_on_another_interface_is_named(node):
    result = preflight(node, fabric_address="10.0.1.22")
    assert "is on enP7s7, not on a fabric interface" in checks(result)["fabric"]["summary"]


def test_gid_index_moves_with_extra_gids_and_a_stale_pin_fails(node):
    node.hcas["rocep1s0f0"] = ("enp1s0f0np0", gid_rows("192.168.100.12", extra_pairs=1))
    result = preflight(node)
    assert result["ok"] and checks(result)["gid"]["facts"]["gid_index"] == 5
    assert result["parity"]["gid_index"] == "rocep1s0f0:5"
    pinned = preflight(node, gid_index_pin=3)
    assert pinned["failed_checks"] == ["gid"]
    assert "the pinned GID index 3 is not the RoCE v2 GID of 192.168.100.12 here" in checks(pinned)["gid"]["summary"]
    assert preflight(node, gid_index_pin=5)["ok"]


def test_only_roce_v2_gids_count(node):
    rows = [r for r in gid_rows("192.168.100.12") if r[1] != "RoCE v2"]
    node.hcas["rocep1s0f0"] = ("enp1s0f0np0", rows)
    gid = checks(preflight(node))["gid"]
    assert gid["status"] == "fail" and "1=IB/RoCE v1 192.168.100.12" in gid["summary"]


def test_an_unknown_hca_is_bad_input_naming_the_known_ones(node):
    with pytest.raises(np.PreflightError, match="unknown HCA mlx5_9: .* has rocep1s0f0, rocep1s0f1"):
        preflight(node, hcas=("mlx5_9",))


def test_named_hcas_must_each_resolve(node):
    result = preflight(node, hcas=("rocep1s0f0", "rocep1s0f1"))
    assert "on rocep1s0f1" in checks(result)["gid"]["summary"]
    assert preflight(node, hcas=("rocep1s0f0",))["ok"]


def test_no_hca_on_the_fabric_interface(node):
    node.hcas = {"rocep1s0f1": ("enp1s0f1np1", gid_rows("192.168.101.12"))}
    assert "no RDMA device maps to enp1s0f0np0" in checks(preflight(node))["gid"]["summary"]


def test_swap_oom_daemons_and_shm(node, tmp_path):
    node.files["swaps"] = (FIX / "swaps.zram").read_text()
    node.processes = {812: ("systemd-oomd", True), 913: ("earlyoom", False), 1001: ("sshd", True)}
    result = preflight(node, min_shm_gib=1 << 20)
    assert result["failed_checks"] == ["swap", "oom_daemons", "shm"]
    c = checks(result)
    assert "/dev/zram0 (16383 MiB partition), /swap.img (8191 MiB file)" in c["swap"]["summary"]
    # earlyoom runs in another mount namespace (a container): not this host's.
    assert c["oom_daemons"]["facts"]["running"] == {"systemd-oomd": [812]}
    assert "systemctl disable --now systemd-oomd.service" in c["oom_daemons"]["fix"]
    assert "needs 1048576.0 GiB" in c["shm"]["summary"]


def test_clock_lock_lost_fails_and_advisory_turns_it_into_a_warning(node):
    node.commands["nvidia-smi"] = (0, (FIX / "nvidia_smi_clock.unlocked").read_text(), "")
    result = preflight(node)
    assert result["failed_checks"] == ["clocks"]
    assert "no SM clock lock is in force, wants 0-2200 MHz" in checks(result)["clocks"]["summary"]
    assert result["parity"]["clocks"] == "unlocked"
    advisory = preflight(node, advisory=("clocks",))
    assert advisory["ok"] and advisory["verdict"] == "start" and advisory["warned_checks"] == ["clocks"]
    assert checks(advisory)["clocks"]["summary"].startswith("advisory (does not stop this run): ")
    assert preflight(node, clock_lock="unlocked")["ok"]
    node.commands["nvidia-smi"] = (0, (FIX / "nvidia_smi_clock.locked").read_text(), "")
    assert preflight(node, clock_lock="unlocked")["failed_checks"] == ["clocks"]
    assert preflight(node, clock_lock_max_mhz=2400)["failed_checks"] == ["clocks"]


def test_a_wedge_in_this_boot_means_power_cycle_needed(node):
    node.commands["journal_0"] = (0, (FIX / "journal.wedge").read_text(), "")
    result = preflight(node)
    log = checks(result)["kernel_log"]
    assert result["failed_checks"] == ["kernel_log"] and result["verdict"] == "power cycle needed"
    assert [h["signature"] for h in log["facts"]["boots"]["0"]["hits"]] == ["nvrm_no_memory", "nvrm_xid"]
    assert "NV_ERR_NO_MEMORY" in log["summary"] and "power cycle" in log["fix"]
    assert "nothing restarts it automatically" in log["fix"]


def test_a_wedge_in_the_previous_boot_warns_or_fails(node):
    node.commands["journal_1"] = (0, (FIX / "journal.mlx5").read_text(), "")
    result = preflight(node)
    assert result["ok"] and result["warned_checks"] == ["kernel_log"]
    assert "the previous boot wedged (aer_fatal, mlx5_fatal)" in checks(result)["kernel_log"]["summary"]
    strict = preflight(node, previous_boot_wedge="fail")
    assert strict["verdict"] == "power cycle needed"


def test_no_previous_boot_in_the_journal_is_fine_but_an_unreadable_journal_is_not(node):
    node.commands["journal_1"] = (1, "", "Data from the specified boot (-1) is not available: No such boot ID in journal")
    result = preflight(node)
    assert result["ok"] and "no previous boot in the journal" in checks(result)["kernel_log"]["summary"]
    node.commands["journal_0"] = FileNotFoundError(2, "No such file or directory")
    assert preflight(node)["failed_checks"] == ["kernel_log"]


@pytest.mark.parametrize("line,signature", [
    ("NVRM: nvAssertOkFailedNoLog: Assertion failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051) returned", "nvrm_no_memory"),
    ("NVRM: Xid (PCI:000f:01:00): 79, pid=1, name=python3, GPU has fallen off the bus.", "nvrm_xid"),
    ("NVRM: Xid (PCI:000f:01:00): 119, pid=1, name=python3, Timeout after 6s of waiting for RPC response", "nvrm_xid"),
    ("NVRM: GPU at PCI:000f:01:00: status 0x51 returned from RM", "nvrm_no_memory"),
    ("mlx5_core 0000:01:00.0: poll_health:800:(pid 0): device's health compromised - reached miss count", "mlx5_fatal"),
    ("pcieport 0000:00:00.0: AER: Uncorrected (Fatal) error message received from 0000:01:00.0", "aer_fatal"),
    ("pcieport 0000:00:00.0: AER: Uncorrected (Non-Fatal) error message received from 0000:01:00.0", None),
    ("NVRM: Xid (PCI:000f:01:00): 13, pid=2, name=python3, Graphics Exception: ESR 0x51dd30=0x0", None),
    ("mlx5_core 0000:01:00.0: firmware version: 28.45.1200", None),
])
def test_wedge_signatures(line, signature):
    hits = np.scan_kernel_log("Nov 29 08:25:42 spark2 kernel: " + line, np.DEFAULT_WEDGE_XIDS)
    assert [h["signature"] for h in hits] == ([signature] if signature else [])


def test_many_wedge_lines_are_capped():
    text = "\n".join("NVRM: Xid (PCI:000f:01:00): 79, GPU has fallen off the bus." for _ in range(40))
    hits = np.scan_kernel_log(text, (79,))
    assert len(hits) == np.MAX_WEDGE_LINES + 1 and hits[-1]["line"] == "... 35 more nvrm_xid lines"


def _built_image(image_id: str, top_layers: list, env: list, created: str) -> str:
    """`docker image inspect` of the recipe's image as one node's own `docker build` made it."""
    return json.dumps([{"Id": image_id, "Created": created, "Container": image_id[7:19],
                        "RootFS": {"Type": "layers", "Layers": ["sha256:" + "b0" * 32] + top_layers},
                        "Config": {"Env": env, "Entrypoint": ["python3", "-u", "/opt/dsv41/boot.py"], "Cmd": ["run"],
                                   "WorkingDir": "/sgl-workspace", "Labels": {"org.opencontainers.image.title": "x"}},
                        "ContainerConfig": {"Cmd": ["/bin/sh", "-c", "#(nop) CMD [\"run\"]"]}}])


def test_one_recipe_built_on_each_node_is_the_same_image_for_parity(tmp_path):
    """Each node `docker build`s the recipe itself: the image ids (and the COPY layers, whose folders carry the build
    time) differ between nodes while the image is the same. Seen on the real engine: `Fleet parity: image differs on
    spark2 (sha256:46dcff2abb6a), spark3 (sha256:80c4035e2de7)` stopped every benchmark. A different env is still a
    different image."""
    env = ["PATH=/usr/bin", "NCCL_VERSION=2.27.7-1", "PYTHONPATH=/opt/dsv41/adapter"]
    parity = {}
    for name, image_id, layers, image_env in (
            ("spark1", "sha256:" + "f7" * 32, ["sha256:" + "b6" * 32, "sha256:" + "2f" * 32], env),
            ("spark2", "sha256:" + "4a" * 32, ["sha256:" + "8e" * 32, "sha256:" + "70" * 32], env),
            ("spark3", "sha256:" + "2e" * 32, ["sha256:" + "d3" * 32, "sha256:" + "c1" * 32],
             env[:2] + ["PYTHONPATH=/elsewhere"])):
        (tmp_path / name).mkdir()
        host = Host(tmp_path / name)
        host.commands["docker"] = (0, _built_image(image_id, layers, image_env, f"2026-12-04T14:3{len(name)}:00Z"), "")
        parity[name] = preflight(host)["parity"]
    assert parity["spark1"]["image"] == parity["spark2"]["image"]
    assert parity["spark1"]["image"] != parity["spark3"]["image"]
    # The node's own image id stays in the record, beside the comparison.
    assert (parity["spark1"]["image_id"], parity["spark2"]["image_id"]) == ("sha256:f7f7f7f7f7f7", "sha256:4a4a4a4a4a4a")


@pytest.mark.parametrize("overrides,text", [
    ({"allowed_kernels": ()}, "allowed_kernels (preflight_allowed_kernels) is empty"),
    ({"allowed_drivers": ()}, "allowed_drivers (preflight_allowed_drivers) is empty"),
    ({"allowed_drivers": ("580.159.03",)}, "must read VERSION-open or VERSION-proprietary, not 580.159.03"),
    ({"fabric_address": "spark2"}, "must be an IPv4 address, not 'spark2'"),
    ({"fabric_interfaces": ()}, "fabric_interfaces (fleet_fabric_interfaces) is empty"),
])
def test_bad_input_is_refused_before_anything_is_read(node, overrides, text):
    with pytest.raises(np.PreflightError, match=".*" + text.replace("(", r"\(").replace(")", r"\)")):
        preflight(node, **overrides)
    assert node.calls == []


def test_empty_allow_lists_are_fine_when_their_check_is_not_run(node):
    result = preflight(node, allowed_kernels=(), allowed_drivers=(), checks=("fabric", "gid"))
    assert result["ok"] and [c["name"] for c in result["checks"]] == ["fabric", "gid"]
    assert sorted(a[0] for a in node.calls) == ["docker", "ip"]


# ------------------------------------------------------------------ the module

@pytest.fixture
def module(node, monkeypatch):
    from ansible.module_utils import node_preflight_module
    monkeypatch.setattr(node_preflight_module, "preflight",
                        functools.partial(np.preflight, paths=node.paths(), run=node.run))
    return load_module("node_preflight_info")


@pytest.fixture
def alias(module):
    return load_module("node_preflight")


MODULE_ARGS = {"allowed_kernels": ["7.0.0-1019-nvidia"], "kho_kernels": ["7.0.0-*-nvidia"],
               "allowed_drivers": ["580.159.03-open"], "fabric_address": "192.168.100.12",
               "fabric_interfaces": ["enp1s0f0np0"], "min_shm_gib": 0.001}


@pytest.mark.parametrize("check_mode", [False, True])
def test_module_reports_without_changing_anything(module, check_mode):
    out = run_module(module, MODULE_ARGS, check_mode=check_mode)
    assert not out.failed and out.result["changed"] is False
    assert out.result["verdict"] == "start" and out.result["ok"] is True
    assert set(out.result) >= {"verdict", "ok", "failed_checks", "warned_checks", "checks", "lines", "parity",
                               "read_errors"}
    assert out.result["lines"][0] == "kernel: PASS: kernel 7.0.0-1019-nvidia is allowed"


def test_module_failed_checks_do_not_fail_the_module(module, node):
    node.files["buddyinfo"] = (FIX / "buddyinfo.fragmented").read_text()
    node.paths()
    out = run_module(module, MODULE_ARGS)
    assert not out.failed and out.result["verdict"] == "reboot first"
    assert out.result["failed_checks"] == ["fragmentation"]


def test_module_fails_on_bad_input_with_one_clear_message(module):
    out = run_module(module, {**MODULE_ARGS, "allowed_kernels": [], "hcas": ["mlx5_9"]})
    assert out.failed
    assert "preflight_allowed_kernels) is empty" in out.result["msg"] and out.result["msg"].startswith("node_preflight_info on ")
    out = run_module(module, {**MODULE_ARGS, "hcas": ["mlx5_9"]})
    assert out.failed and "unknown HCA mlx5_9" in out.result["msg"]


def test_the_role_keeps_the_node_summary_from_the_result_on_success_and_on_bad_input(module):
    # node_preflight_info returns no ansible_facts; the role's set_fact builds preflight_result with the filter.
    f = _filters()
    labels = {"host": "spark2", "rank": 1}
    out = run_module(module, MODULE_ARGS)
    assert "ansible_facts" not in out.result
    fact = f.FilterModule().filters()["preflight_node_result"](out.result, labels)
    assert (fact["host"], fact["rank"], fact["verdict"], fact["ok"], fact["error"]) == ("spark2", 1, "start", True, "")
    assert fact["lines"] == out.result["lines"] and fact["parity"] == out.result["parity"]
    gid = next(c for c in out.result["checks"] if c["name"] == "gid")["facts"]["hcas"]
    assert fact["gid"] == gid and fact["gid"], "the resolved GID per HCA is what the engine's env takes"
    bad = run_module(module, {**MODULE_ARGS, "hcas": ["mlx5_9"]})
    fact = f.from_registered(bad.result, labels)
    assert bad.failed and not fact["ok"] and fact["verdict"] == "not read" and "unknown HCA mlx5_9" in fact["error"]
    assert fact["gid"] == {} and fact["host"] == "spark2"
    crashed = f.from_registered({"failed": True, "msg": "MODULE FAILURE"}, labels)
    assert (crashed["verdict"], crashed["ok"], crashed["error"]) == ("not read", False, "MODULE FAILURE")
    assert f.from_registered({}, {})["error"] == "node_preflight_info gave no answer"
    refused = run_module(module, {**MODULE_ARGS, "fact_name": "preflight_result"})
    assert refused.failed and "fact_name" in refused.result["msg"]


def test_the_deprecated_alias_still_sets_the_same_summary_as_a_fact_and_warns(module, alias, monkeypatch):
    from ansible.module_utils import basic
    deprecations = []
    monkeypatch.setattr(basic.AnsibleModule, "deprecate",
                        lambda self, msg, version=None, **kw: deprecations.append((msg, version)))
    # Both runs read the machine's real /dev/shm: hold its statvfs still between them (free bytes move with
    # whatever else runs on the machine, which made this comparison flaky).
    import os
    real_statvfs, seen = os.statvfs, {}
    monkeypatch.setattr(os, "statvfs", lambda path: seen.setdefault(os.fspath(path), real_statvfs(path)))
    f = _filters()
    labels = {"host": "spark2", "rank": 1}
    new = run_module(module, MODULE_ARGS).result
    assert deprecations == []
    old = run_module(alias, {**MODULE_ARGS, "fact_name": "preflight_result", "fact_labels": labels}).result
    assert old["ansible_facts"]["preflight_result"] == f.from_registered(new, labels)
    assert {k: v for k, v in old.items() if k != "ansible_facts"} == new
    bad = run_module(alias, {**MODULE_ARGS, "hcas": ["mlx5_9"], "fact_name": "preflight_result", "fact_labels": labels})
    assert bad.failed and bad.result["msg"].startswith("node_preflight on ")
    assert bad.result["ansible_facts"]["preflight_result"]["error"] == bad.result["msg"]
    assert deprecations[0] == ("node_preflight is now called node_preflight_info (a read-only module returns no "
                               "ansible_facts); replace the module name, the options and results are the same except "
                               "fact_name and fact_labels: register the result and build the fact with the "
                               "preflight_node_result filter.", "2.0.0")


# ------------------------------------------------------------------ the parity filter (roles/preflight)

def _filters():
    spec = importlib.util.spec_from_file_location("preflight_filters",
                                                  ROOT / "plugins/filter/preflight.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _hostvars(parities: dict) -> dict:
    return {h: {"fleet_rank": rank, "preflight_result": {"parity": p, "verdict": "start", "lines": ["x: PASS: y"]}}
            for rank, (h, p) in enumerate(parities.items())}


def test_parity_reports_the_odd_host_against_the_majority():
    f = _filters()
    base = {"kernel": "7.0.0-1019-nvidia", "gid_index": "rocep1s0f0:3"}
    hv = _hostvars({"spark1": base, "spark2": base, "spark3": {**base, "gid_index": "rocep1s0f0:5"}})
    parity = f.preflight_parity(hv, ["spark3", "spark1", "spark2"], ["kernel", "gid_index"], True)
    assert parity["hosts"] == ["spark1", "spark2", "spark3"] and parity["required"] is True
    assert parity["differences"] == [{
        "key": "gid_index", "reference": "rocep1s0f0:3", "hosts": {"spark3": "rocep1s0f0:5"},
        "text": "gid_index differs on spark3 (rocep1s0f0:5) from rocep1s0f0:3 on spark1, spark2"}]
    assert parity["table"][2].split() == ["gid_index", "rocep1s0f0:3", "rocep1s0f0:3", "rocep1s0f0:5", "*"]
    report = f.preflight_report(hv, parity)
    assert report[0] == "== spark1: START" and "   DIFFERENCE: gid_index differs" in report[-1]


def test_parity_tie_goes_to_the_head_and_unread_hosts_are_not_differences():
    f = _filters()
    hv = _hostvars({"spark1": {"kernel": "a"}, "spark2": {"kernel": "b"}, "spark3": {}})
    parity = f.preflight_parity(hv, ["spark1", "spark2", "spark3"], ["kernel"])
    assert parity["rows"][0]["reference"] == "a" and parity["rows"][0]["values"]["spark3"] == "not read"
    assert [d["hosts"] for d in parity["differences"]] == [{"spark2": "b"}]
    assert f.preflight_parity(_hostvars({"spark1": {"kernel": "a"}}), ["spark1"], ["kernel"])["differences"] == []


def test_package_holds_parse_keeps_installed_packages_and_their_holds():
    spec = importlib.util.spec_from_file_location("package_holds_filters",
                                                  ROOT / "plugins/filter/package_holds.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = ("linux-image-7.0.0-1019-nvidia\t7.0.0-1019.19\thi \n"
           "nvidia-driver-580-open\t580.159.03-0ubuntu1\tii \n"
           "linux-image-6.17.0-1008-nvidia\t6.17.0-1008.8\trc \n"
           "linux-firmware\t20250901.git6b0c4f8a-0ubuntu1\tii \n"
           "garbage line\n")
    assert mod.package_holds_parse(out) == {
        "linux-image-7.0.0-1019-nvidia": {"version": "7.0.0-1019.19", "held": True},
        "nvidia-driver-580-open": {"version": "580.159.03-0ubuntu1", "held": False},
        "linux-firmware": {"version": "20250901.git6b0c4f8a-0ubuntu1", "held": False}}


def test_package_versions_and_holds_are_reported_every_run(node):
    node.commands["dpkg-query"] = (1, "linux-image-7.0.0-1019-nvidia\t7.0.0-1019.19\thi \n"
                                      "nvidia-driver-580-open\t580.159.03-0ubuntu1\tii \n", "no packages found matching x")
    result = preflight(node, packages=("linux-image-*nvidia*", "nvidia-driver-*", "x"))
    assert result["ok"] and result["packages"] == {
        "linux-image-7.0.0-1019-nvidia": {"version": "7.0.0-1019.19", "held": True},
        "nvidia-driver-580-open": {"version": "580.159.03-0ubuntu1", "held": False}}
    assert ["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${db:Status-Abbrev}\n", "linux-image-*nvidia*",
            "nvidia-driver-*", "x"] in node.calls


def test_per_node_keys_are_noted_not_differences():
    # Each rank's engine uses its own node's GID index: a moved index is expected, the parity gate must not fail on it.
    f = _filters()
    base = {"kernel": "7.0.0-1019-nvidia", "gid_index": "rocep1s0f0:3"}
    hv = _hostvars({"spark1": base, "spark2": base, "spark3": {"kernel": "7.0.0-1023-nvidia", "gid_index": "rocep1s0f0:5"}})
    parity = f.preflight_parity(hv, ["spark1", "spark2", "spark3"], ["kernel", "gid_index"], True, ["gid_index"])
    assert [d["key"] for d in parity["differences"]] == ["kernel"]
    assert [(d["key"], d["hosts"]) for d in parity["notes"]] == [("gid_index", {"spark3": "rocep1s0f0:5"})]
    assert parity["table"][2].split()[-1] == "*", "the table still marks the odd value"
    report = f.preflight_report(hv, parity)
    assert "   PER NODE (expected, not a difference): gid_index differs on spark3" in report[-1]
    assert any(line.startswith("   DIFFERENCE: kernel differs on spark3") for line in report)
