"""experiment_load_info (and its deprecated alias experiment_load): one experiment of the real catalog, validated,
with its prerequisites checked against the kept experiments."""
from __future__ import annotations

import pytest

from tests.conftest import ROOT, load_module
from tests.unit.module_harness import run_module

MODULE = load_module("experiment_load_info")
ALIAS = load_module("experiment_load")
CATALOG = str(ROOT / "experiments")


def test_loads_an_experiment_of_the_catalog_with_the_catalog_names():
    res = run_module(MODULE, {"name": "cache_gib", "catalog": CATALOG})
    assert not res.failed and res.result["changed"] is False
    assert res.result["experiment"]["name"] == "cache_gib"
    assert "cache_gib" in res.result["catalog_names"] and "wo_a_drop" in res.result["catalog_names"]


def test_an_unknown_name_fails_naming_the_catalog():
    res = run_module(MODULE, {"name": "no_such_experiment", "catalog": CATALOG})
    assert res.failed and res.result["msg"].startswith("unknown experiment 'no_such_experiment'; the catalog has: ")


def test_a_missing_prerequisite_fails_and_the_kept_one_passes():
    doc = run_module(MODULE, {"name": "wo_a_drop", "catalog": CATALOG}, check_mode=True)
    assert doc.failed and "needs these experiments kept first" in doc.result["msg"]
    needs = doc.result["msg"].split("kept first: ", 1)[1].split(" (kept now", 1)[0].split(", ")
    assert not run_module(MODULE, {"name": "wo_a_drop", "catalog": CATALOG, "kept": needs}).failed


def test_the_deprecated_alias_returns_the_same_and_warns(monkeypatch):
    from ansible.module_utils import basic
    deprecations = []
    monkeypatch.setattr(basic.AnsibleModule, "deprecate",
                        lambda self, msg, version=None, **kw: deprecations.append((msg, version)))
    params = {"name": "cache_gib", "catalog": CATALOG}
    new = run_module(MODULE, params).result
    assert deprecations == []
    assert run_module(ALIAS, params).result == new
    assert deprecations == [("experiment_load is now called experiment_load_info (a read-only module returns no "
                             "ansible_facts); replace the module name, the options and results are the same.", "2.0.0")]


@pytest.fixture(autouse=True)
def _serialization_profile(monkeypatch):
    from ansible.module_utils import basic
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy")


def test_an_experiment_file_the_campaign_wrote_loads(tmp_path):
    """campaign_step writes a combination's (and a layered child's) experiment file with data_yaml (every string
    tagged !unsafe, so nothing in it is ever templated); the rollout must read it back. The 6-rung campaign
    (2026-12-04) failed its combination rung: "could not determine a constructor for the tag '!unsafe'"."""
    import yaml

    from ansible.module_utils.campaign_plan import combined
    from ansible.module_utils.experiments import data_yaml

    docs = {n: yaml.safe_load((ROOT / "experiments" / f"{n}.yml").read_text()) for n in ("folded_fence", "verify_cap_conf01")}
    doc = combined(docs["verify_cap_conf01"], [docs["folded_fence"]])
    path = tmp_path / f"{doc['name']}.yml"
    path.write_text(data_yaml(doc, f"{doc['name']}: written by playbooks/campaign.yml for rung 09-combination"))
    assert "!unsafe" in path.read_text()
    res = run_module(MODULE, {"file": str(path), "catalog": CATALOG})
    assert not res.failed, res.result.get("msg")
    assert res.result["experiment"] == doc and res.result["experiment"]["includes"] == ["verify_cap_conf01", "folded_fence"]
