"""library/bench_report: Markdown tables, PNG plots, candidate against incumbent, idempotence, check mode."""
from __future__ import annotations

import json
import random
from unittest import mock

import pytest
from matplotlib import image

from ansible.module_utils import basic
from ansible.module_utils.bench_stats import summarize
from tests.conftest import load_module
from tests.unit.module_harness import run_module

bench_report = load_module("bench_report")


@pytest.fixture(autouse=True)
def serialization_profile():
    """ansible-core 2.19 modules need a serialization profile, which module_harness does not set."""
    with mock.patch.object(basic, "_ANSIBLE_PROFILE", "legacy"):
        yield


def fake_run(scale: float, seed: int, invalid: tuple = ()) -> dict:
    """A decode_bench-shaped result: prose/code x c1/c2/c4, decode rates ~ scale * base."""
    rng = random.Random(seed)
    conditions = []
    for kind, base in (("prose", 26.0), ("code", 39.0)):
        for c in (1, 2, 4):
            if (kind, c) in invalid:
                conditions.append({"type": kind, "concurrency": c, "valid": False, "stats": None, "samples": None,
                                   "reasons": ["foreign_traffic: the server reported up to 3 running + queued "
                                               "requests during rep 1, which sent 1"]})
                continue
            per_stream = base * scale / (1 + 0.14 * (c - 1) ** 0.9)
            decode = [rng.gauss(per_stream, per_stream * 0.01) for _ in range(5 * c)]
            aggregate = [rng.gauss(per_stream * c, per_stream * c * 0.01) for _ in range(5)]
            samples = {"decode_tok_s": decode, "aggregate_tok_s": aggregate,
                       "ttft_ms": [rng.gauss(40, 2) for _ in decode], "tpot_ms": [1000 / d for d in decode],
                       "e2e_s": [256 / d for d in decode]}
            stats = {k: summarize(v) for k, v in samples.items()}
            stats["spec"] = {"tokens_per_step": summarize([2.57] * 5), "step_ms": summarize([98.0] * 5)}
            conditions.append({"type": kind, "concurrency": c, "valid": True, "reasons": [], "stats": stats,
                               "samples": samples})
    return {"started": "2026-11-29T19:00:00+00:00", "finished": "2026-11-29T19:05:00+00:00",
            "model": "DeepSeek-V4.1-Flash", "config": {"max_tokens": 256, "warmup": 2, "reps": 5, "temperature": 0.0},
            "conditions": conditions, "requests": [], "server": {},
            "invalid_count": sum(1 for c in conditions if not c["valid"])}


def test_report_with_incumbent(tmp_path):
    candidate = fake_run(1.1, seed=1, invalid=(("code", 2),))
    incumbent_path = tmp_path / "incumbent.json"
    incumbent_path.write_text(json.dumps(fake_run(1.0, seed=2)))
    dest = tmp_path / "run"
    res = run_module(bench_report, dict(results=candidate, incumbent=str(incumbent_path), dest=str(dest),
                                        title="packed vs unpacked"))
    assert not res.failed, res.result.get("msg")
    result = res.result
    assert result["changed"] is True and result["invalid_count"] == 1
    assert result["report"] == str(dest / "report.md")
    assert sorted(result["plots"]) == sorted(str(dest / "plots" / f"{n}.png")
                                             for n in ("decode_tok_s", "aggregate_tok_s", "ttft_ms"))
    report = (dest / "report.md").read_text()
    assert report.startswith("# packed vs unpacked\n")
    assert "## Conditions (candidate)" in report and "## Conditions (incumbent)" in report
    assert "| code | 2 | **invalid** | - |" in report
    assert "- code c2: foreign_traffic: the server reported up to 3 running" in report
    assert "![Decode rate per stream (tok/s)](plots/decode_tok_s.png)" in report
    rows = {(r["type"], r["concurrency"]): r for r in result["comparisons"]}
    assert rows[("code", 2)]["ratio"] is None and rows[("code", 2)]["note"] == "candidate invalid"
    prose1 = rows[("prose", 1)]
    assert prose1["ratio"] == pytest.approx(1.1, rel=0.03) and prose1["ci_low"] > 1.0
    assert f"| prose | 1 | {prose1['candidate_median']:.1f} | {prose1['incumbent_median']:.1f} | " \
           f"{prose1['ratio']:.3f} |" in report
    for path in result["plots"]:
        pixels = image.imread(path)
        assert pixels.shape[0] > 200 and pixels.shape[1] > 400  # a real figure, not an empty canvas
        assert pixels[..., :3].std() > 0.05


def test_second_run_changes_nothing_and_check_mode_writes_nothing(tmp_path):
    args = dict(results=fake_run(1.0, seed=3), dest=str(tmp_path / "run"))
    check = run_module(bench_report, args, check_mode=True, diff=True)
    assert check.result["changed"] is True and not (tmp_path / "run").exists()
    assert check.result["diff"]["before"] == "" and "# Decode benchmark" in check.result["diff"]["after"]
    first = run_module(bench_report, args)
    assert first.result["changed"] is True and len(first.result["written"]) == 4
    second = run_module(bench_report, args)
    assert second.result["changed"] is False and second.result["written"] == []
    assert run_module(bench_report, args, check_mode=True).result["changed"] is False
    changed = run_module(bench_report, dict(args, title="Other title"))
    assert changed.result["written"] == [str(tmp_path / "run" / "report.md")]


def test_single_run_has_no_comparison(tmp_path):
    res = run_module(bench_report, dict(results=fake_run(1.0, seed=4), dest=str(tmp_path)))
    report = (tmp_path / "report.md").read_text()
    assert res.result["comparisons"] == [] and "Candidate against incumbent" not in report
    assert "| run | 2026-11-29T19:00:00+00:00 |" in report


@pytest.mark.parametrize("results, message", [
    ("/nonexistent/bench.json", "cannot read a decode_bench result from /nonexistent/bench.json"),
    ({"msg": "not a result"}, "results is not a decode_bench result"),
])
def test_bad_input(tmp_path, results, message):
    res = run_module(bench_report, dict(results=results, dest=str(tmp_path)))
    assert res.failed and message in res.result["msg"]
