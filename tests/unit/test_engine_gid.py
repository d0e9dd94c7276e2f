"""The RoCE v2 GID index per node (docs/reference.md section 11): the engine_env filters that put each node's resolved
index into its rank's env, and the simulator's NCCL set-up that fails a rank whose index is not its RoCE v2 GID."""
from __future__ import annotations

import importlib.util
import ipaddress
import os

import pytest

from tests.conftest import ROOT
from testbed.engine import autotune as sim_autotune
from testbed.engine import netib

_spec = importlib.util.spec_from_file_location(
    "sparkfleet_filter_engine_env_gid", ROOT / "plugins" / "filter" / "engine_env.py")
envf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(envf)

ADDRESS = "10.213.4.13"


def gid_tables(root, address=ADDRESS, extra_pairs=0, rank=2):
    """The testbed's stand-in tables (testbed/tb/hostinit.py sys_class): link-local v1/v2, optional extra IPv6
    pairs (the gid_moved knob), then the IPv4-mapped v1/v2 pair; a second HCA with link-local GIDs only."""
    link_local = f"fe80:0000:0000:0000:5e00:10ff:fe13:{rank + 1:02x}00"
    rows = [(link_local, "IB/RoCE v1"), (link_local, "RoCE v2")]
    for extra in range(extra_pairs):
        global6 = ipaddress.IPv6Address(f"fd00:213::{rank + 1:x}:{extra + 1:x}").exploded
        rows += [(global6, "IB/RoCE v1"), (global6, "RoCE v2")]
    v4 = ipaddress.IPv6Address("::ffff:" + address).exploded
    rows += [(v4, "IB/RoCE v1"), (v4, "RoCE v2")]
    for hca, ndev, table in (("rocep1s0f0", "eth0", rows),
                             ("rocep1s0f1", "enp1s0f1np1", [(link_local.replace("fe13", "fe14"), "RoCE v2")])):
        base = os.path.join(root, hca, "ports", "1")
        for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            os.makedirs(os.path.join(base, sub), exist_ok=True)
        for index in range(16):
            gid, kind = table[index] if index < len(table) else ("0000:" * 7 + "0000", None)
            open(os.path.join(base, "gids", str(index)), "w").write(gid + "\n")
            if kind:
                open(os.path.join(base, "gid_attrs/types", str(index)), "w").write(kind + "\n")
                open(os.path.join(base, "gid_attrs/ndevs", str(index)), "w").write(ndev + "\n")
    return str(root)


# ---------------------------------------------------------------- the simulator's NCCL set-up

def test_the_resolved_index_connects_and_is_logged_like_nccl(tmp_path):
    root = gid_tables(tmp_path, extra_pairs=1)            # RoCE v2 of the address at index 5
    out = netib.setup({"NCCL_IB_GID_INDEX": "5", "NCCL_IB_HCA": "rocep1s0f0:1"}, ADDRESS, root)
    assert out["ok"] and out["gid_index"] == 5 and out["hcas"] == ["rocep1s0f0:1"], out
    assert "NCCL INFO NCCL_IB_GID_INDEX set by environment to 5." in out["lines"]
    assert f"NCCL INFO NET/IB : rocep1s0f0:1 GID index 5 (RoCE v2 ::ffff:{ADDRESS})" in out["lines"]


def test_a_stale_index_fails_naming_what_it_points_at_and_where_the_right_one_is(tmp_path):
    root = gid_tables(tmp_path, extra_pairs=1)
    out = netib.setup({"NCCL_IB_GID_INDEX": "3"}, ADDRESS, root)   # index 3 is the extra IPv6 pair's RoCE v2 GID
    assert not out["ok"]
    assert "GID index 3 is RoCE v2 fd00:213::3:1, not the RoCE v2 GID of 10.213.4.13" in out["error"]
    assert "index 5 here" in out["error"] and "ibv_modify_qp failed with 110" in out["error"]
    assert out["lines"][-1].startswith("NCCL WARN NET/IB : ")


@pytest.mark.parametrize("index, text", [("2", "is IB/RoCE v1"), ("9", "is not populated"), ("x", "not an integer")])
def test_other_wrong_indices_fail(tmp_path, index, text):
    out = netib.setup({"NCCL_IB_GID_INDEX": index}, ADDRESS, gid_tables(tmp_path))
    assert not out["ok"] and text in out["error"], out


def test_unset_keys_auto_select_the_roce_v2_gid_of_the_address_on_its_nic(tmp_path):
    out = netib.setup({}, ADDRESS, gid_tables(tmp_path, extra_pairs=1))
    assert out["ok"] and out["gid_index"] == 5 and out["hcas"] == ["rocep1s0f0:1"]


def test_nccl_ib_hca_selects_devices_like_nccl(tmp_path):
    root = gid_tables(tmp_path)
    devs = netib.devices(root)
    assert netib.select(devs, "=rocep1s0f1", ADDRESS) == [("rocep1s0f1", "1")]
    assert netib.select(devs, "^rocep1s0f1", ADDRESS) == [("rocep1s0f0", "1")]
    assert netib.select(devs, "rocep1s0", ADDRESS) == [("rocep1s0f0", "1"), ("rocep1s0f1", "1")]
    out = netib.setup({"NCCL_IB_HCA": "mlx5_0"}, ADDRESS, root)
    assert not out["ok"] and "matches no device" in out["error"]


def test_without_rdma_devices_nccl_falls_back_to_sockets(tmp_path):
    out = netib.setup({"NCCL_IB_GID_INDEX": "3"}, ADDRESS, str(tmp_path / "none"))
    assert out["ok"] and "NCCL INFO NET/IB : No device found." in out["lines"]


def test_the_simulated_keep_adapter_ignores_the_gid_keys():
    env = {"DSV41_AUTOTUNE_KEEP": "1", "NCCL_IB_GID_INDEX": "3", "NCCL_IB_HCA": "rocep1s0f0:1"}
    moved = dict(env, NCCL_IB_GID_INDEX="5")
    assert sim_autotune.env_fingerprint(env, ["run"]) == sim_autotune.env_fingerprint(moved, ["run"])
    assert sim_autotune.env_fingerprint(env, ["run"]) != sim_autotune.env_fingerprint(dict(env, NCCL_ALGO="Ring"), ["run"])


# ---------------------------------------------------------------- engine_env filters

HCAS = {"rocep1s0f0": {"port": 1, "index": 5, "gid": "::ffff:10.213.4.13", "ndev": "eth0"}}


def test_resolved_hcas_give_the_rank_keys():
    assert envf.engine_env_gid_keys(HCAS) == {
        "keys": {"NCCL_IB_GID_INDEX": "5", "NCCL_IB_HCA": "rocep1s0f0:1"}, "problem": ""}
    two = dict(HCAS, rocep2s0f0={"port": 1, "index": 5, "gid": "x", "ndev": "eth1"})
    assert envf.engine_env_gid_keys(two)["keys"]["NCCL_IB_HCA"] == "rocep1s0f0:1,rocep2s0f0:1"


def test_nothing_resolved_or_differing_indices_is_a_problem_not_a_silent_default():
    assert "no RoCE v2 GID was resolved" in envf.engine_env_gid_keys({})["problem"]
    assert envf.engine_env_gid_keys({})["keys"] == {}
    split = dict(HCAS, rocep2s0f0={"port": 1, "index": 3, "gid": "x", "ndev": "eth1"})
    out = envf.engine_env_gid_keys(split)
    assert out["keys"] == {} and "different GID indices" in out["problem"] and "rocep2s0f0:1 index 3" in out["problem"]


def test_a_pin_is_checked_against_the_node():
    assert envf.engine_env_gid_check({"NCCL_IB_GID_INDEX": "5"}, HCAS, "spark3", 2, ADDRESS) == ""
    stale = envf.engine_env_gid_check({"NCCL_IB_GID_INDEX": "3"}, HCAS, "spark3", 2, ADDRESS)
    assert stale.startswith("spark3 (rank 2): NCCL_IB_GID_INDEX is pinned to 3 but the RoCE v2 GID of 10.213.4.13 "
                            "is at rocep1s0f0 port 1 index 5")
    assert "NCCL_IB_HCA is pinned to mlx5_0" in envf.engine_env_gid_check(
        {"NCCL_IB_GID_INDEX": "5", "NCCL_IB_HCA": "mlx5_0"}, HCAS, "spark3", 2, ADDRESS)
    assert "no RoCE v2 GID" in envf.engine_env_gid_check({"NCCL_IB_GID_INDEX": "5"}, {}, "spark3", 2, ADDRESS)
    assert envf.engine_env_gid_check({}, HCAS, "spark3", 2, ADDRESS) == ""


@pytest.mark.parametrize("env, per_rank, mode, text", [
    ({"NCCL_IB_GID_INDEX": "3"}, {}, "resolved", "engine_env set NCCL_IB_GID_INDEX, but engine_env_nccl_gid is resolved"),
    ({}, {"NCCL_IB_HCA": {0: "x"}}, "resolved", "engine_env_per_rank set NCCL_IB_HCA"),
    ({}, {}, "pinned", "engine_env_nccl_gid is pinned but engine_env has no NCCL_IB_GID_INDEX"),
    ({}, {}, False, "engine_env_nccl_gid must be one of resolved, pinned, unmanaged"),
])
def test_gid_mode_problems(env, per_rank, mode, text):
    problems = envf.engine_env_gid_problems(env, per_rank, mode)
    assert any(text in p for p in problems), problems


def test_gid_modes_accept_consistent_input():
    assert envf.engine_env_gid_problems({"TP_SIZE": "3"}, {"NODE_RANK": "0"}, "resolved") == []
    assert envf.engine_env_gid_problems({"NCCL_IB_GID_INDEX": "3"}, {"NCCL_IB_GID_INDEX": {2: "5"}}, "pinned") == []
    assert envf.engine_env_gid_problems({"NCCL_IB_GID_INDEX": "3"}, {}, "unmanaged") == []


def test_the_gid_keys_are_volatile_in_the_autotune_fingerprint():
    base = {"DSV41_AUTOTUNE_KEEP": "1", "NCCL_IB_GID_INDEX": "3", "NCCL_IB_HCA": "rocep1s0f0:1"}
    fp = envf.engine_env_fingerprint(base)
    assert fp == envf.engine_env_fingerprint(dict(base, NCCL_IB_GID_INDEX="5"))          # moved after a reboot
    assert fp == envf.engine_env_fingerprint({"DSV41_AUTOTUNE_KEEP": "1"})                 # preflight skipped long ago
    assert fp != envf.engine_env_fingerprint(dict(base, NCCL_IB_QPS_PER_CONNECTION="2"))   # other NCCL_ keys count
