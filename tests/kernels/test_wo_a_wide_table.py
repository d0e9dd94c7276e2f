"""Issue 26: the dispatcher table of the wide path, chosen from the H200 sweep
(docs/measurements/wo_a_issue26_wide_sweep.json, benchmarks/wo_a_wide_sweep.py), and the benchmark's
handling of wide-path rows. Pure Python on the CPU; no kernel runs."""
from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="kernel tests need torch: pip install -r requirements-kernels.txt")
pytest.importorskip("triton", reason="kernel tests need triton: pip install -r requirements-kernels.txt")

from kernels import wo_a_gluon as GL  # noqa: E402
from kernels import wo_a_w8 as K  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import wo_a_bench as B  # noqa: E402
import wo_a_wide_sweep as S  # noqa: E402

pytestmark = pytest.mark.kernels
SWEEP = ROOT / "docs" / "measurements" / "wo_a_issue26_wide_sweep.json"


@pytest.fixture(scope="module")
def sweep_rows():
    return json.loads(SWEEP.read_text())["rows"]


def measured(rows, g, m, name):
    """The best correct, graph-stable time of one path at (G, M) in the sweep."""
    return min(r["us"] for r in rows if r["G"] == g and r["M"] == m and r["name"] == name and "us" in r
               and r["rel_err_vs_fp64"] < 1e-2 and r["graph_matches_eager"])


def test_wide_table_from_the_h200_sweep(sweep_rows):
    """The table picks, per bucket, the fastest measured fp8-only path: wide only where it beats mid,
    which on the H200 is 17..32 rows at G=2 and G=4 (the sweep's own table once took wide up to
    96/192 rows although mid was faster from 48 rows on)."""
    table = S.choose_table(sweep_rows)
    assert table["wide_max_m"] == {2: 32, 4: 32}
    assert [top for top, _ in table["wide"][2]] == [24, 32] == [top for top, _ in table["wide"][4]]
    for g in (2, 4):
        for b in table["buckets"][g]:
            m, path = b["M"], b["path"]
            assert path == ("wide" if m <= 32 else "mid" if m <= K.MID_MAX_M else "prefill"), b
            assert b["us"] == measured(sweep_rows, g, m, "wide" if path == "wide" else path)
            if path == "wide":  # wide beats mid and prefill where it serves
                assert b["us"] < min(measured(sweep_rows, g, m, "mid"), measured(sweep_rows, g, m, "prefill"))
            else:  # and is not faster than mid by a margin where it does not
                assert measured(sweep_rows, g, m, "wide") * 1.05 >= min(
                    measured(sweep_rows, g, m, n) for n in ("mid", "prefill") if m <= K.MID_MAX_M or n == "prefill")
    # the held bf16 weight's einsum beats the dispatched fp8 path from 33 rows on, at both G
    assert table["einsum_faster"] == [[33, 1024, 2], [33, 1024, 4]]


def test_wide_run_stops_at_the_first_bucket_it_loses():
    """The wide path serves 17..wide_max_m rows: a later bucket where wide wins again is not taken."""
    def rows(m, wide, mid, prefill=50.0, ein=10.0):
        base = {"G": 4, "M": m, "rel_err_vs_fp64": 1e-3, "graph_matches_eager": True}
        return [dict(base, name="einsum", config=None, us=ein + 2, us_no_copy=ein),
                dict(base, name="prefill", config=None, us=prefill),
                dict(base, name="mid", config=None, us=mid),
                dict(base, name="wide", config=asdict(GL.RingConfig(32, 32, 4, 2, 6, pdl=True, row_warps=2)), us=wide)]
    table = S.choose_table(rows(24, 9.0, 12.0) + rows(48, 13.0, 12.0) + rows(64, 8.0, 12.0))
    assert table["wide_max_m"] == {4: 24}
    assert [b["path"] for b in table["buckets"][4]] == ["wide", "mid", "mid"]
    assert table["einsum_faster"] == [[25, 64, 4]]  # 48 and 64 merged into one range
    assert S.choose_table(rows(24, 11.9, 12.0))["wide_max_m"] == {4: 16}  # within the margin of mid: mid stays
    wrong = rows(24, 5.0, 12.0)
    wrong[3]["graph_matches_eager"] = False
    assert S.choose_table(wrong)["wide_max_m"] == {4: 16}  # a tiling whose graph result differs never counts


def test_installed_wide_table_is_the_measured_one(sweep_rows):
    """kernels/wo_a_w8.py holds what the sweep chose: same bounds, same tilings per bucket."""
    table = S.choose_table(sweep_rows)
    assert K.WIDE_MAX_M == table["wide_max_m"]
    for g, entries in table["wide"].items():
        assert K.WIDE_TABLE[g] == tuple((top, GL.RingConfig(**c)) for top, c in entries)


def test_wide_dispatch_and_einsum_preference_on_the_h200(monkeypatch):
    """With the installed tables: 17..32 rows run wide at G=2 and G=4, 33..192 the tc path (TC_TABLE)
    or mid (G=2 65..96), more the prefill path; a caller holding the bf16 weight gets the
    einsum exactly where it measured faster (33+ rows). On sm_90 (issue 26, fifth session) 33..192 rows and
    the prefill rows of WG_TABLE run wg instead."""
    monkeypatch.setattr(GL, "available", lambda device: True)
    ms = (16, 17, 24, 32, 33, 48, 49, 64, 65, 128, 129, 192, 193)
    monkeypatch.setattr(K._wg, "available", lambda device: True)
    monkeypatch.setattr(K, "_FAILED", {})
    for g in (2, 4):
        assert [K.select_path(m, g, "cuda") for m in ms] == ["gluon", "wide", "wide", "wide"] + ["wg"] * 9
    monkeypatch.setattr(K._wg, "available", lambda device: False)  # other GPUs: the tables below wg
    assert [K.select_path(m, 2, "cuda") for m in ms] == \
        ["gluon", "wide", "wide", "wide", "tc", "tc", "tc", "tc", "mid", "tc", "tc", "tc", "einsum"]
    assert [K.select_path(m, 4, "cuda") for m in ms] == \
        ["gluon", "wide", "wide", "wide", "tc", "tc", "tc", "tc", "tc", "tc", "tc", "tc", "einsum"]
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(K, "_device_name", lambda device: "NVIDIA H200")
    for g in (2, 4):
        assert [K.einsum_is_faster(m, "cuda", g) for m in (16, 17, 32, 33, 192)] == [False, False, False, True, True]


def test_apply_wide_table_installs_a_sweep_table(monkeypatch, sweep_rows):
    """benchmarks/wo_a_bench.py --wide-table: the JSON of the sweep's --table-out drives the dispatcher."""
    monkeypatch.setattr(K, "WIDE_TABLE", {})
    monkeypatch.setattr(K, "WIDE_MAX_M", {})
    monkeypatch.setattr(K, "EINSUM_FASTER", {})
    monkeypatch.setattr(GL, "available", lambda device: True)
    monkeypatch.setattr(K._wg, "available", lambda device: False)
    B.apply_wide_table(json.loads(json.dumps(S.choose_table(sweep_rows))))  # through JSON: string keys
    assert K.WIDE_MAX_M == {2: 32, 4: 32} and set(K.WIDE_TABLE) == {2, 4}
    assert [K.select_path(m, 4, "cuda") for m in (32, 33)] == ["wide", "tc" if K._tc_entry(33, 4) else "mid"]
    assert K.EINSUM_FASTER["H200"] == ((33, 1024, 2), (33, 1024, 4))


def test_wide_rows_get_a_plain_launch_config():
    """wo_a_bench.py times wide-path rows (17+) without PDL too: their plain tiling is the wide tiling with
    PDL off (the ring's 1..16-row table has none for 17+ rows, so asdict(None) crashed the H200 run)."""
    used = GL.RingConfig(32, 32, 4, 2, 6, pdl=True, row_warps=2)
    assert GL.default_ring_config(24, 4, 1024, 4096, 132, 232448, pdl=False) is None
    plain = B.plain_ring_config("wide", used, 24, 4)
    assert plain == GL.RingConfig(32, 32, 4, 2, 6, pdl=False, row_warps=2)
    assert asdict(plain)["pdl"] is False
