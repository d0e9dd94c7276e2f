"""module_utils/liveness_smoke.py: the rollout's smoke answer comes from the boot's own liveness check."""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "module_utils"))
from liveness_smoke import smoke_answer  # noqa: E402

Q = "What is 19 + 23? Reply only with the number."


def _result(answer="42"):
    return {"ok": True, "smoke": [{"prompt": "What is 7 * 8? Reply only with the number.", "answer": "56"},
                                  {"prompt": Q, "expected": "42", "answer": answer, "ok": answer == "42"}]}


def test_the_answer_to_the_same_prompt_is_taken_as_it_came():
    assert smoke_answer(_result(), Q) == "42"
    assert smoke_answer(_result(" 41\n"), Q) == " 41\n"


def test_no_result_a_skipped_one_or_another_prompt_asks_again():
    assert smoke_answer({}, Q) is None                                   # forgotten before the boot, liveness off
    assert smoke_answer(None, Q) is None
    assert smoke_answer({"skipped": True, "smoke": _result()["smoke"]}, Q) is None
    assert smoke_answer(_result(), "What is 2 + 2?") is None
    assert smoke_answer({"smoke": [{"prompt": Q, "answer": None}]}, Q) is None


def test_the_engine_forgets_the_last_liveness_before_each_boot_and_the_rollout_asks_only_without_it():
    plan = (ROOT / "roles/engine/tasks/plan.yml").read_text()
    forget = next(t for t in yaml.safe_load(plan)[1]["block"] if t["name"].startswith("Forget an earlier"))
    assert forget["ansible.builtin.set_fact"]["_engine_liveness"] == {}
    boot = yaml.safe_load((ROOT / "roles/rollout/tasks/boot.yml").read_text())[0]["block"]
    ask = next(t for t in boot if t["name"].startswith("Ask the head the exact-answer smoke prompt"))
    assert "_rollout_live_smoke is none" in str(ask["when"])
    assert "liveness_smoke_answer(rollout_smoke_prompt)" in str(yaml.safe_load((ROOT / "roles/rollout/tasks/boot.yml").read_text())[0]["vars"])
    record = next(t for t in boot if t["name"] == "Record this rank's checks")
    assert "_rollout_live_smoke if _rollout_live_smoke is not none" in record["ansible.builtin.set_fact"]["_rollout_checks"]
