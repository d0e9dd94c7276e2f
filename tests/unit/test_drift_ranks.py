"""module_utils/drift_ranks.py: the drift rows that compare ranks with each other (issue 25 item 5, issue 20
item 7): the engine env across ranks, the NCCL GID keys on every rank, one adapters image on every rank."""
from ansible.module_utils.drift import build_report
from ansible.module_utils.drift_ranks import across_rank_rows, value_at

ENV_FIX = "ansible-playbook playbooks/engine.yml -e engine_state=restarted (a key meant per rank: engine_env_per_rank)"
GID_FIX = "ansible-playbook playbooks/engine.yml -e engine_state=restarted (engine_env_nccl_gid=resolved)"
IMAGE_FIX = "ansible-playbook playbooks/adapters.yml (adapters_release names the release)"
ACROSS = [
    {"item": "engine env across ranks", "action": "engine_container", "value": "container.env",
     "compare": "same_as_reference", "reference": "spark1", "except": ["NODE_RANK", "NCCL_IB_GID_INDEX"],
     "desired": "as rank 0 except NODE_RANK, NCCL_IB_GID_INDEX", "fix": ENV_FIX},
    {"item": "engine_env NCCL GID keys across ranks", "action": "engine_container", "value": "container.env",
     "compare": "set_on_all", "keys": ["NCCL_IB_GID_INDEX", "NCCL_IB_HCA"],
     "desired": "set on every rank or on none", "fix": GID_FIX},
    {"item": "adapters image across ranks", "action": "engine_container", "value": "container.image_id",
     "compare": "one_value", "desired": "one image on every running rank", "fix": IMAGE_FIX},
]
IMG_A = "sha256:" + "a" * 64
IMG_B = "sha256:" + "b" * 64


def engine(rank: int, image_id: str = IMG_A, **env):
    base = {"MODEL": "dsv41", "NODE_RANK": str(rank), "NCCL_IB_GID_INDEX": "3", "NCCL_IB_HCA": "rocep1s0f0:1"}
    base.update(env)
    result = {"container": {"name": "dsv41-worker", "running": True, "status": "running", "image_id": image_id,
                            "env": {k: v for k, v in base.items() if v is not None}},
              "image_id": image_id, "differences": [],
              "invocation": {"module_args": {"name": "dsv41-worker", "state": "started", "image": "x", "env": {},
                                             "mounts": []}}}
    return {"role": "engine", "task": "Compare", "action": "engine_container", "status": "ok", "changed": False,
            "handler": False, "planner": True, "delegated": False, "item": None, "msg": "", "diff": None,
            "result": result}


NODES = ["spark1", "spark2", "spark3"]


def converged():
    return {"spark1": [engine(0)], "spark2": [engine(1)], "spark3": [engine(2, NCCL_IB_GID_INDEX="5")]}


def rows_of(records):
    return {(n, r["item"]): r for n, rows in across_rank_rows(records, NODES, ACROSS).items() for r in rows}


def test_a_converged_fleet_has_the_three_rows_without_drift():
    rows = rows_of(converged())
    assert set(rows) == {("spark2", "engine env across ranks"), ("spark3", "engine env across ranks"),
                         *((n, "engine_env NCCL GID keys across ranks") for n in NODES),
                         *((n, "adapters image across ranks") for n in NODES)}
    assert not any(r["drifted"] for r in rows.values())
    assert rows[("spark2", "engine env across ranks")]["actual"] == "same"
    assert rows[("spark1", "adapters image across ranks")]["actual"] == "same on 3 rank(s): " + "a" * 12


def test_an_env_key_that_differs_from_rank_0_is_named_with_both_values():
    records = converged()
    records["spark3"] = [engine(2, NCCL_IB_GID_INDEX="5", MODEL="other", EXTRA="1")]
    row = rows_of(records)[("spark3", "engine env across ranks")]
    assert row["drifted"] and row["fix"] == ENV_FIX
    assert row["actual"] == "differs: EXTRA=1 (rank 0: (absent)), MODEL=other (rank 0: dsv41)"
    assert not rows_of(records)[("spark2", "engine env across ranks")]["drifted"]


def test_a_rank_without_a_container_is_not_comparable():
    records = converged()
    records["spark2"][0]["result"]["container"] = None
    row = rows_of(records)[("spark2", "engine env across ranks")]
    assert row["drifted"] and row["actual"] == "not comparable (no container on spark2)"
    # The image agreement compares the ranks that run one.
    assert rows_of(records)[("spark1", "adapters image across ranks")]["actual"] == "same on 2 rank(s): " + "a" * 12


def test_gid_keys_set_on_some_ranks_only_are_drift_on_every_rank():
    records = converged()
    records["spark2"] = [engine(1, NCCL_IB_GID_INDEX=None, NCCL_IB_HCA=None)]
    rows = rows_of(records)
    for node in NODES:
        row = rows[(node, "engine_env NCCL GID keys across ranks")]
        assert row["drifted"] and row["fix"] == GID_FIX
        assert row["actual"] == ("differ: spark1 NCCL_IB_GID_INDEX=3 NCCL_IB_HCA=rocep1s0f0:1, spark2 NCCL_IB_GID_INDEX="
                                 "(unset) NCCL_IB_HCA=(unset), spark3 NCCL_IB_GID_INDEX=5 NCCL_IB_HCA=rocep1s0f0:1")


def test_two_images_across_ranks_are_drift_naming_each_rank():
    records = converged()
    records["spark2"] = [engine(1, IMG_B)]
    row = rows_of(records)[("spark3", "adapters image across ranks")]
    assert row["drifted"] and row["fix"] == IMAGE_FIX
    assert row["actual"] == f"differ: spark1 {'a' * 12}, spark2 {'b' * 12}, spark3 {'a' * 12}"


def test_nodes_without_the_action_take_no_part():
    assert across_rank_rows({"spark1": [], "spark2": []}, NODES, ACROSS) == {}
    assert value_at({"a": {"b": 1}}, "a.b") == 1 and value_at({"a": None}, "a.b") is None


def test_the_report_shows_the_cross_rank_rows_and_drift_fail_names_them():
    records = converged()
    records["spark3"] = [engine(2, NCCL_IB_GID_INDEX="5", MODEL="other")]
    report = build_report(records, NODES, [], {}, ACROSS)
    assert report["drifted"] == 1
    assert "spark3 engine env across ranks: differs: MODEL=other (rank 0: dsv41)" in report["failure_msg"]
    assert ENV_FIX in report["failure_msg"]
    assert any("engine env across ranks" in line and "  YES  " in line for line in report["table"])


def test_drift_yml_takes_one_release_built_on_every_node_as_one_image():
    """playbooks/drift.yml's own row: every node `docker build`s the release itself, so on a real engine each rank's
    image id differs for the same release (seen: `adapters image across ranks | differ: spark1 28dfa00ef8c9, spark2
    88a00c7c0094, spark3 f6dae30b8175` on a converged fleet). The row compares the release each rank runs (the image
    reference: the adapters role tags a release by its bundle digest); two releases are still drift."""
    from pathlib import Path

    import yaml
    play = [p for p in yaml.safe_load((Path(__file__).resolve().parents[2] / "playbooks" / "drift.yml").read_text())
            if "vars" in p][0]
    row = [r for r in play["vars"]["drift_across_ranks"] if r["item"] == "adapters image across ranks"]

    def running(rank: int, image_id: str, ref: str):
        record = engine(rank, image_id)
        record["result"]["container"]["image"] = ref
        return [record]

    release = "dsv41-3x-spark:bundle-3f9a0c1d2e4b"
    records = {"spark1": running(0, IMG_A, release), "spark2": running(1, IMG_B, release),
               "spark3": running(2, "sha256:" + "c" * 64, release)}
    rows = {(n, r["item"]): r for n, rs in across_rank_rows(records, NODES, row).items() for r in rs}
    assert not any(r["drifted"] for r in rows.values()), rows
    records["spark3"] = running(2, IMG_A, "dsv41-3x-spark:bundle-0000aaaa1111")
    rows = {(n, r["item"]): r for n, rs in across_rank_rows(records, NODES, row).items() for r in rs}
    assert rows[("spark1", "adapters image across ranks")]["drifted"]
    assert "spark3 dsv41-3x-spark:bundle-0000aaaa1111" in rows[("spark1", "adapters image across ranks")]["actual"]
