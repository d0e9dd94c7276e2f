"""The experiment catalog: every file valid against the schema; the schema catches real mistakes."""
import re
from pathlib import Path

import pytest
import yaml

from ansible.module_utils.experiments import marker_matches, missing_prerequisites, validate

CATALOG = Path(__file__).resolve().parents[2] / "experiments"
REQUIRED = {"pack_engram", "quiesce", "autotune_keep", "folded_fence", "wo_a_w8", "wo_a_w8_mid",
            "engram_prefetch_check", "engram_prefetch", "wo_a_drop", "draft_head_fp8", "dspark_block_5",
            "verify_cap_conf01", "draft_tau", "block_verify", "cache_gib", "clocks_unlocked", "slots_8"}


def load_all():
    return {p.stem: yaml.safe_load(p.read_text()) for p in sorted(CATALOG.glob("*.yml"))}


def test_the_plan_is_complete():
    assert REQUIRED <= set(load_all())


@pytest.mark.parametrize("name", sorted(p.stem for p in CATALOG.glob("*.yml")))
def test_every_experiment_is_valid(name):
    docs = load_all()
    assert validate(docs[name], name) == []
    assert missing_prerequisites(docs[name], kept=list(docs), catalog=docs) == []


def test_drop_needs_w8_and_tau_needs_folded_sampling():
    docs = load_all()
    assert "wo_a_w8" in docs["wo_a_drop"]["prerequisites"]
    assert docs["wo_a_drop"]["memory"]["delta_mib_per_rank"] == -688
    assert missing_prerequisites(docs["draft_tau"], kept=[], catalog=docs) == ["folded_sampling"]


def good():
    return yaml.safe_load((CATALOG / "folded_fence.yml").read_text())


@pytest.mark.parametrize("mutate,expected", [
    (lambda d: d.pop("markers_on"), "missing field 'markers_on'"),
    (lambda d: d.update(stage="Z"), "stage 'Z'"),
    (lambda d: d.update(apply={}), "apply changes nothing"),
    (lambda d: d["apply"].update(env={"lower-case": "1"}), "is not an environment variable name"),
    (lambda d: d["apply"].update(env={"DSV41_X": 1}), "must be a string"),
    (lambda d: d.update(markers_on=["re:(unclosed"]), "bad regex"),
    (lambda d: d.update(colour="red"), "unknown field 'colour'"),
    (lambda d: d["workloads"].update(primary={"type": "poetry", "concurrency": 1}), "workloads.primary"),
    (lambda d: d["memory"].update(delta_mib_per_rank="a lot"), "delta_mib_per_rank"),
    (lambda d: d["apply"].update(playbook="site.yml"), "needs a revert"),
])
def test_schema_rejects(mutate, expected):
    doc = good()
    mutate(doc)
    problems = validate(doc, "folded_fence")
    assert any(expected in p for p in problems), problems


def test_name_must_match_file():
    assert any("differs from the file name" in p for p in validate(good(), "other"))


def test_markers():
    assert marker_matches("re:gamma=\\d+", "... gamma=5, verify")
    assert marker_matches("[block_verify] armed", "[x TP1] [block_verify] armed")
    assert not marker_matches("[block_verify] armed", "block verify armed")


@pytest.mark.parametrize("revert, problem", [
    ("rollback.yml", "'revert' must be dict"), ({}, "revert must name a playbook"),
    ({"playbook": "site"}, "revert must name a playbook"),
    ({"playbook": "site.yml", "tags": "quiesce"}, "revert.tags must be a list"),
    ({"playbook": "site.yml", "tags": ["ok", 3]}, "revert.tags must be a list"),
    ({"playbook": "site.yml", "tags": [""]}, "revert.tags must be a list")])
def test_a_revert_step_that_cannot_run_is_a_problem(revert, problem):
    doc = good()
    doc["apply"] = {"playbook": "site.yml", "tags": ["quiesce"]}
    doc["revert"] = revert
    assert any(problem in p for p in validate(doc, doc["name"])), validate(doc, doc["name"])


def test_apply_tags_must_be_names():
    doc = good()
    doc["apply"] = {"playbook": "site.yml", "tags": "quiesce"}
    doc["revert"] = {"playbook": "site.yml", "tags": ["quiesce"]}
    assert any("apply.tags must be a list" in p for p in validate(doc, doc["name"]))
    doc["apply"]["tags"] = ["quiesce"]
    assert validate(doc, doc["name"]) == []


# --- ready ladders (issue 20 item 9) ------------------------------------------------------------------
LADDERS = Path(__file__).resolve().parents[2] / "ladders"


def test_the_ladder_header_example_exists_and_every_stage_has_a_ladder():
    header = (LADDERS.parent / "playbooks" / "ladder.yml").read_text()
    named = re.findall(r"ladder=(ladders/[\w.-]+\.yml)", header)
    assert named and all((LADDERS.parent / n).is_file() for n in named), named
    stages = {yaml.safe_load(p.read_text())["name"].split("-")[1].upper() for p in LADDERS.glob("stage-*.yml")}
    assert stages == set("BCDEFGHI")  # stage A changes hosts: rollout.yml on its own


@pytest.mark.parametrize("path", sorted(LADDERS.glob("*.yml")), ids=lambda p: p.name)
def test_each_ladder_names_env_experiments_that_can_run_from_one_incumbent(path):
    docs = load_all()
    ladder = yaml.safe_load(path.read_text())
    assert ladder["name"] == path.stem and ladder["experiments"]
    for name in ladder["experiments"]:
        assert name in docs, f"{path.name}: unknown experiment {name}"
        assert not docs[name]["apply"].get("playbook"), f"{path.name}: {name} changes hosts"
        # A trial runs from the incumbent: a prerequisite inside the same ladder could never be kept first.
        assert not set(docs[name]["prerequisites"]) & set(ladder["experiments"]), (path.name, name)
        stage = path.stem.split("-")[1].upper()
        assert docs[name]["stage"] == stage, (path.name, name, docs[name]["stage"])


def test_trial_phase_follows_the_evidence(tmp_path):
    from ansible.module_utils.experiments import trial_phase

    assert trial_phase(str(tmp_path)) == "recording the restore point"
    (tmp_path / "restore-point.json").write_text("{}")
    assert trial_phase(str(tmp_path)) == "incumbent arm (measuring)"
    (tmp_path / "bench-incumbent.json").write_text("{}")
    (tmp_path / "boot-logs" / "candidate").mkdir(parents=True)
    assert trial_phase(str(tmp_path)) == "candidate arm (booted, measuring)"
    (tmp_path / "rollout.json").write_text("{}")
    assert trial_phase(str(tmp_path)) == "done"


# The real fleet's boot logs (docs/reference.md section 10): some lines only rank 0 prints (the KV summary with
# max_running_requests=..., the autotune disagreement). markers_on must appear on every rank, so a marker of
# such a line can never pass the candidate's marker gate: slots_8 required max_running_requests=8 and failed on
# both workers in the 6-rung campaign (2026-12-04), never measured.
REAL_LOGS = Path(__file__).resolve().parent / "fixtures" / "boot_logs"


@pytest.mark.parametrize("name", sorted(p.stem for p in CATALOG.glob("*.yml")))
def test_no_marker_required_on_every_rank_is_a_line_only_the_head_prints(name):
    head = (REAL_LOGS / "real_tp3_head.log").read_text()
    worker = (REAL_LOGS / "real_tp3_worker1.log").read_text()
    for marker in load_all()[name]["markers_on"]:
        key = re.match(r"\s*([A-Za-z_][A-Za-z0-9_.]*=)", marker) if not marker.startswith("re:") else None
        if key:
            assert not (key.group(1) in head and key.group(1) not in worker), (
                f"{name}: markers_on {marker!r} is a line only rank 0 prints ({key.group(1)}...): "
                "it can never appear on every rank")
