#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module: Markdown report and PNG plots of a decode_bench run (controller side, matplotlib Agg)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_report
short_description: Write a Markdown report with PNG plots for a decode_bench result
description:
  - Turns a C(decode_bench) result (and optionally an incumbent's) into C(report.md) and C(plots/*.png)
    under O(dest). Runs on the controller (C(delegate_to=localhost)); needs matplotlib, drawn with the
    Agg backend.
  - The tables give, per condition (type x concurrency), validity, decode tok/s median with min-max, IQR,
    CV, TPOT, TTFT, aggregate tok/s and the speculative view. Invalid conditions show their reasons and no
    numbers.
  - The plots show, per prompt type and concurrency, the median with min-max whiskers of decode tok/s
    per stream, aggregate tok/s and TTFT; candidate and incumbent side by side when both exist.
  - With an incumbent, a comparison table gives median(candidate) / median(incumbent) of the per-request
    decode rates with a 95 % percentile bootstrap interval (2000 resamples, seed 0).
  - Files are written only when their content changes (temp file, fsync, rename), so a second run with
    the same input reports C(changed=false); check mode renders in memory and writes nothing.
version_added: "0.1.0"
author: sparkfleet contributors (!UNKNOWN)
options:
  results:
    description: The candidate run, as the registered result of C(decode_bench) or the path of a JSON file holding it.
    type: raw
    required: true
  incumbent:
    description: The incumbent run to compare against (same forms as O(results)).
    type: raw
    required: false
  dest:
    description: The run folder; C(report.md) and C(plots/) go in it (created if missing).
    type: path
    required: true
  title:
    description: The report's title.
    type: str
    default: Decode benchmark
attributes:
  check_mode:
    support: full
    description: Check mode computes the report and its diff and writes nothing.
  diff_mode:
    support: partial
    description: The diff covers C(report.md).
    details: The diff covers C(report.md); plots are reported by name only.
requirements:
  - matplotlib (controller)
"""

EXAMPLES = r"""
- name: Write the run's benchmark report
  bench_report:
    results: "{{ bench }}"
    incumbent: "{{ run_dir_incumbent }}/bench.json"
    dest: "{{ run_dir }}"
    title: "wo_a W8 vs baseline"
  delegate_to: localhost
"""

RETURN = r"""
report:
  description: Path of the Markdown report.
  returned: always
  type: str
  sample: runs/2026-11-29T1936/report.md
plots:
  description: Paths of the PNG plots.
  returned: always
  type: list
  elements: str
  sample: [runs/2026-11-29T1936/plots/decode_tok_s.png, runs/2026-11-29T1936/plots/aggregate_tok_s.png]
written:
  description: The files whose content changed (written, or that would be in check mode).
  returned: always
  type: list
  elements: str
  sample: [runs/2026-11-29T1936/report.md]
comparisons:
  description: Candidate against incumbent per condition, when an incumbent was given.
  returned: always
  type: list
  elements: dict
  sample:
    - {type: prose, concurrency: 1, ratio: 1.052, ci_low: 1.031, ci_high: 1.07, candidate_median: 27.6,
       incumbent_median: 26.2}
invalid_count:
  description: Invalid conditions in the candidate run.
  returned: always
  type: int
  sample: 0
"""

import io
import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.file_io import write_atomic
from ansible.module_utils.bench_stats import bootstrap_ratio_ci

PLOTS = (
    ("decode_tok_s", "Decode rate per stream (tok/s)"),
    ("aggregate_tok_s", "Aggregate throughput per wave (tok/s)"),
    ("ttft_ms", "Time to first token (ms)"),
)


def load_run(value, label: str) -> dict:
    """A decode_bench result given inline or as a JSON file path; ValueError naming what is wrong."""
    if isinstance(value, str):
        try:
            with open(value) as handle:
                value = json.load(handle)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{label}: cannot read a decode_bench result from {value}: {exc}") from None
    if not isinstance(value, dict) or not isinstance(value.get("conditions"), list):
        raise ValueError(f"{label} is not a decode_bench result (no 'conditions' list)")
    return value


def _fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _key(cond: dict) -> tuple:
    return cond["type"], cond["concurrency"]


def compare(candidate: dict, incumbent: dict | None) -> list[dict]:
    """Per condition valid in both runs: ratio of median decode rates and its bootstrap interval."""
    if not incumbent:
        return []
    inc = {_key(c): c for c in incumbent["conditions"]}
    rows = []
    for cond in candidate["conditions"]:
        other = inc.get(_key(cond))
        if other is None:
            continue
        row = {"type": cond["type"], "concurrency": cond["concurrency"], "ratio": None, "ci_low": None,
               "ci_high": None, "candidate_median": None, "incumbent_median": None, "note": ""}
        if not cond["valid"] or not other["valid"]:
            row["note"] = "candidate invalid" if not cond["valid"] else "incumbent invalid"
            if not cond["valid"] and not other["valid"]:
                row["note"] = "both invalid"
        else:
            cand_s = [v for v in cond["samples"]["decode_tok_s"] if v is not None]
            inc_s = [v for v in other["samples"]["decode_tok_s"] if v is not None]
            lo, hi, ratio = bootstrap_ratio_ci(cand_s, inc_s, n=2000, seed=0)
            row.update(ratio=ratio, ci_low=lo, ci_high=hi, candidate_median=cond["stats"]["decode_tok_s"]["median"],
                       incumbent_median=other["stats"]["decode_tok_s"]["median"])
        rows.append(row)
    return rows


def _run_lines(run: dict, label: str) -> list[str]:
    cfg = run.get("config") or {}
    return [f"| {label} | {run.get('started', '-')} | {run.get('finished', '-')} | {run.get('model', '-')} | "
            f"{cfg.get('max_tokens', '-')} | {cfg.get('warmup', '-')} | {cfg.get('reps', '-')} | "
            f"{cfg.get('temperature', '-')} | {run.get('invalid_count', '-')} |"]


def render_markdown(candidate: dict, incumbent: dict | None, title: str, comparisons: list[dict]) -> str:
    lines = [f"# {title}", "",
             "Decode rate = (completion tokens - 1) / (last text chunk - first text chunk), tokens from "
             "`usage.completion_tokens`; median [min-max] over every request of the measured waves; "
             "aggregate = tokens of a wave / its wall time. Definitions: docs/bench.md.", "",
             "| run | started | finished | model | max_tokens | warmup | reps | temperature | invalid |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += _run_lines(candidate, "candidate" if incumbent else "run")
    if incumbent:
        lines += _run_lines(incumbent, "incumbent")
    for label, run in (("candidate" if incumbent else "", candidate), ("incumbent", incumbent)):
        if not run:
            continue
        lines += ["", f"## Conditions{' (' + label + ')' if label else ''}", "",
                  "| type | c | valid | decode tok/s median [min-max] | IQR | CV | TPOT ms | TTFT ms | "
                  "aggregate tok/s | tok/step | step ms |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for cond in run["conditions"]:
            stats = cond.get("stats")
            if not cond["valid"] or not stats:
                lines.append(f"| {cond['type']} | {cond['concurrency']} | **invalid** | "
                             + " | ".join(["-"] * 8) + " |")
                continue
            dec, spec = stats["decode_tok_s"], stats.get("spec") or {}
            cv = dec.get("cv")
            lines.append(
                f"| {cond['type']} | {cond['concurrency']} | yes | {_fmt(dec['median'])} "
                f"[{_fmt(dec['min'])}-{_fmt(dec['max'])}] | {_fmt(dec['iqr'])} | "
                f"{_fmt(None if cv is None else 100 * cv)} % | {_fmt(stats['tpot_ms']['median'])} | "
                f"{_fmt(stats['ttft_ms']['median'])} | {_fmt(stats['aggregate_tok_s']['median'])} | "
                f"{_fmt((spec.get('tokens_per_step') or {}).get('median'), 2)} | "
                f"{_fmt((spec.get('step_ms') or {}).get('median'))} |")
        invalid = [c for c in run["conditions"] if not c["valid"]]
        if invalid:
            lines += ["", "Invalid conditions (no numbers are reported for them):", ""]
            lines += [f"- {c['type']} c{c['concurrency']}: " + "; ".join(c["reasons"]) for c in invalid]
    if comparisons:
        lines += ["", "## Candidate against incumbent", "",
                  "Ratio of median decode tok/s per stream, 95 % bootstrap interval (2000 resamples, seed 0).", "",
                  "| type | c | candidate | incumbent | ratio | 95 % CI |", "|---|---|---|---|---|---|"]
        for row in comparisons:
            if row["ratio"] is None:
                lines.append(f"| {row['type']} | {row['concurrency']} | - | - | - | {row['note']} |")
            else:
                lines.append(f"| {row['type']} | {row['concurrency']} | {_fmt(row['candidate_median'])} | "
                             f"{_fmt(row['incumbent_median'])} | {row['ratio']:.3f} | "
                             f"{row['ci_low']:.3f}-{row['ci_high']:.3f} |")
    lines += ["", "## Plots", ""]
    lines += [f"![{caption}](plots/{name}.png)" for name, caption in PLOTS]
    return "\n".join(lines) + "\n"


def render_plot(metric: str, caption: str, candidate: dict, incumbent: dict | None) -> bytes:
    """One PNG: a panel per prompt type, median with min-max whiskers at each concurrency."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    runs = [("candidate" if incumbent else "run", candidate, "tab:blue")]
    if incumbent:
        runs.append(("incumbent", incumbent, "tab:gray"))
    types = list(dict.fromkeys(c["type"] for _, run, _ in runs for c in run["conditions"]))
    levels = sorted({c["concurrency"] for _, run, _ in runs for c in run["conditions"]})
    fig, axes = plt.subplots(1, max(1, len(types)), figsize=(3.6 * max(1, len(types)), 3.4), squeeze=False)
    width = 0.18 if incumbent else 0.0
    for ax, kind in zip(axes[0], types):
        for offset_index, (label, run, color) in enumerate(runs):
            offset = (offset_index - (len(runs) - 1) / 2) * 2 * width
            for cond in run["conditions"]:
                if cond["type"] != kind:
                    continue
                x = levels.index(cond["concurrency"]) + offset
                stats = (cond.get("stats") or {}).get(metric) if cond["valid"] else None
                if stats is None:
                    ax.annotate("invalid", (x, 0.04), xycoords=("data", "axes fraction"), color=color,
                                ha="center", fontsize=7, rotation=90)
                    continue
                ax.errorbar([x], [stats["median"]], yerr=[[stats["median"] - stats["min"]],
                                                          [stats["max"] - stats["median"]]],
                            fmt="o", color=color, capsize=4, markersize=5, label=label)
        ax.set_title(kind)
        ax.set_xticks(range(len(levels)))
        ax.set_xticklabels([f"c{c}" for c in levels])
        ax.set_xlim(-0.6, len(levels) - 0.4)
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        if len(unique) > 1:
            ax.legend(unique.values(), unique.keys(), fontsize=7, loc="lower right")
    axes[0][0].set_ylabel(caption)
    fig.suptitle(caption + " - median, whiskers min-max", fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def build(candidate: dict, incumbent: dict | None, dest: str, title: str) -> dict:
    """Every file of the report as {path: bytes}, plus the comparisons."""
    comparisons = compare(candidate, incumbent)
    files = {os.path.join(dest, "report.md"):
             render_markdown(candidate, incumbent, title, comparisons).encode()}
    for name, caption in PLOTS:
        files[os.path.join(dest, "plots", f"{name}.png")] = render_plot(name, caption, candidate, incumbent)
    return {"files": files, "comparisons": comparisons}


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(results=dict(type="raw", required=True), incumbent=dict(type="raw"),
                           dest=dict(type="path", required=True), title=dict(type="str", default="Decode benchmark")),
        supports_check_mode=True)
    dest = module.params["dest"]
    try:
        candidate = load_run(module.params["results"], "results")
        incumbent = load_run(module.params["incumbent"], "incumbent") if module.params["incumbent"] else None
    except ValueError as exc:
        module.fail_json(msg=str(exc), dest=dest)
    try:
        built = build(candidate, incumbent, dest, module.params["title"])
    except ImportError as exc:
        module.fail_json(msg=f"bench_report needs matplotlib on the controller ({exc}); run it with "
                             "delegate_to: localhost and the project venv's python", dest=dest)
    report = os.path.join(dest, "report.md")
    written = [path for path, data in built["files"].items() if _read(path) != data]
    result = dict(changed=bool(written), report=report, written=written, comparisons=built["comparisons"],
                  plots=[p for p in built["files"] if p.endswith(".png")],
                  invalid_count=sum(1 for c in candidate["conditions"] if not c["valid"]))
    if module._diff and report in written:
        before = _read(report)
        result["diff"] = {"before_header": report, "after_header": report,
                          "before": before.decode() if before else "", "after": built["files"][report].decode()}
    if not module.check_mode:
        try:
            for path in written:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                write_atomic(path, built["files"][path])
        except OSError as exc:
            module.fail_json(msg=f"cannot write the report under {dest}: {exc}", dest=dest)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
