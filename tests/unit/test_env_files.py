"""library/env_files.py and module_utils/env_files.py: a rank's env files in one module run (issue 23, the env files'
rendering), the same bytes the role's template wrote, check mode, diff, secrets masked, bad input refused before
any file is written, and one drift row a file (module_utils/drift.py env_files_rows)."""
from __future__ import annotations

import grp
import os
import pwd

import pytest

from ansible.module_utils import drift
from ansible.module_utils.env_files import EnvFileError, env_file_text
from tests.conftest import load_module
from tests.unit.module_harness import run_module

MODULE = load_module("env_files")
HEADER = "#\n# Ansible managed\n#"  # lookup('config', 'DEFAULT_MANAGED_STR') | comment
ME = pwd.getpwuid(os.getuid()).pw_name
MY_GROUP = grp.getgrgid(os.getgid()).gr_name

# What roles/engine_env's template (env_file.j2, removed) wrote on the testbed for a rank's own keys: the module
# must leave a fleet's existing files untouched (no change, no reboot) when the env is the same.
TEMPLATE_TEXT = (
    "#\n# Ansible managed\n#\n"
    "# this rank's own keys (MEM_FRACTION_STATIC, NCCL_IB_GID_INDEX, NCCL_IB_HCA, NODE_RANK: engine_env_per_rank and "
    "the RoCE v2 GID of this node).\n"
    "# docker --env-file format: one KEY=value per line, taken literally (no quotes, no $ expansion); not a shell file.\n"
    "MEM_FRACTION_STATIC=0.95\nNCCL_IB_GID_INDEX=3\nNCCL_IB_HCA=rocep1s0f0:1\nNODE_RANK=1\n"
)
RANK_WHAT = ("this rank's own keys (MEM_FRACTION_STATIC, NCCL_IB_GID_INDEX, NCCL_IB_HCA, NODE_RANK: "
             "engine_env_per_rank and the RoCE v2 GID of this node)")
RANK_ENV = {"NODE_RANK": "1", "MEM_FRACTION_STATIC": "0.95", "NCCL_IB_GID_INDEX": "3", "NCCL_IB_HCA": "rocep1s0f0:1"}


def args(tmp_path, shared=None, rank=None, **extra):
    out = {"header": HEADER, "owner": ME, "group": MY_GROUP, "mode": "0640", "files": [
        {"path": str(tmp_path / "sparkfleet.env"), "env": shared if shared is not None else {"PORT": "8888"},
         "what": "the serving env every rank shares (identical on every node)"},
        {"path": str(tmp_path / "sparkfleet-rank.env"), "env": rank if rank is not None else dict(RANK_ENV),
         "what": RANK_WHAT},
    ]}
    out.update(extra)
    return out


def test_the_text_is_the_templates_byte_for_byte():
    assert env_file_text(HEADER, RANK_WHAT, RANK_ENV) == TEMPLATE_TEXT


def test_keys_are_sorted_as_jinjas_dictsort_does_case_insensitive():
    text = env_file_text("", "", {"b": "1", "A": "2", "C": "3"})
    assert text.splitlines()[1:] == ["A=2", "b=1", "C=3"]


@pytest.mark.parametrize("env, needle", [
    ({"BAD KEY": "1"}, "is not a variable name"),
    ({"A": "x\ny"}, "newline"),
    ({"A": True}, "boolean"),
    ({"A": None}, "no value"),
])
def test_a_bad_key_or_value_is_refused(env, needle):
    with pytest.raises(EnvFileError, match=needle):
        env_file_text(HEADER, "x", env)


def test_an_existing_template_written_file_is_left_alone(tmp_path):
    (tmp_path / "sparkfleet-rank.env").write_text(TEMPLATE_TEXT)
    os.chmod(tmp_path / "sparkfleet-rank.env", 0o640)
    before = os.stat(tmp_path / "sparkfleet-rank.env")
    out = run_module(MODULE, args(tmp_path))
    assert not out.failed, out.result
    by_path = {f["path"]: f for f in out.result["files"]}
    assert by_path[str(tmp_path / "sparkfleet-rank.env")]["changed"] is False
    assert by_path[str(tmp_path / "sparkfleet.env")]["created"] is True
    assert os.stat(tmp_path / "sparkfleet-rank.env").st_ino == before.st_ino, "an unchanged file is not rewritten"


def test_writes_both_files_then_is_idempotent(tmp_path):
    first = run_module(MODULE, args(tmp_path))
    assert not first.failed and first.result["changed"] is True
    shared = tmp_path / "sparkfleet.env"
    assert shared.read_text().endswith("PORT=8888\n")
    assert oct(os.stat(shared).st_mode & 0o777) == "0o640"
    again = run_module(MODULE, args(tmp_path))
    assert again.result["changed"] is False and not any(f["changed"] for f in again.result["files"])


def test_check_mode_reports_and_changes_nothing_with_a_diff_per_changed_file(tmp_path):
    run_module(MODULE, args(tmp_path))
    shared = tmp_path / "sparkfleet.env"
    text = shared.read_text()
    out = run_module(MODULE, args(tmp_path, shared={"PORT": "9999"}), check_mode=True, diff=True)
    assert out.result["changed"] is True and shared.read_text() == text
    assert [f["changed"] for f in out.result["files"]] == [True, False]
    (d,) = out.result["diff"]
    assert d["before_header"] == str(shared) and "PORT=8888" in d["before"] and "PORT=9999" in d["after"]


def test_check_mode_on_a_missing_file_says_it_would_create_it(tmp_path):
    out = run_module(MODULE, args(tmp_path), check_mode=True)
    assert out.result["changed"] is True and not any(tmp_path.iterdir())
    assert all(f["created"] for f in out.result["files"])


def test_a_mode_change_alone_is_a_change(tmp_path):
    run_module(MODULE, args(tmp_path))
    os.chmod(tmp_path / "sparkfleet.env", 0o644)
    out = run_module(MODULE, args(tmp_path), diff=True)
    assert [f["changed"] for f in out.result["files"]] == [True, False]
    assert oct(os.stat(tmp_path / "sparkfleet.env").st_mode & 0o777) == "0o640"


def test_secrets_are_masked_in_diff_invocation_and_files_stay_real(tmp_path):
    run_module(MODULE, args(tmp_path, shared={"PORT": "8888", "HF_TOKEN": "hf_old_secret_value"}))
    out = run_module(MODULE, args(tmp_path, shared={"PORT": "8888", "HF_TOKEN": "hf_new_secret_value",
                                                    "LICENSE": "lic-42"}, secret_env_keys=["LICENSE"]),
                     diff=True)
    shown = repr(out.result)
    for secret in ("hf_old_secret_value", "hf_new_secret_value", "lic-42"):
        assert secret not in shown, secret
    assert "HF_TOKEN=********" in out.result["diff"][0]["after"]
    assert "HF_TOKEN=hf_new_secret_value" in (tmp_path / "sparkfleet.env").read_text()


def test_bad_input_fails_before_any_file_is_written(tmp_path):
    out = run_module(MODULE, args(tmp_path, rank={"NODE_RANK": "1\nEVIL=1"}))
    assert out.failed and "newline" in out.result["msg"]
    assert not any(tmp_path.iterdir()), "the first file is not written when the second is bad"


def test_a_path_that_is_not_a_regular_file_is_refused(tmp_path):
    (tmp_path / "sparkfleet.env").mkdir()
    out = run_module(MODULE, args(tmp_path))
    assert out.failed and "not a regular file" in out.result["msg"]
    (tmp_path / "sparkfleet.env").rmdir()
    os.symlink("/etc/passwd", tmp_path / "sparkfleet.env")
    out = run_module(MODULE, args(tmp_path))
    assert out.failed and "not a regular file" in out.result["msg"]


def test_a_missing_folder_is_named(tmp_path):
    out = run_module(MODULE, args(tmp_path / "absent"))
    assert out.failed and "does not exist" in out.result["msg"]


def _record(result, status="ok"):
    return {"role": "engine_env", "task": "Render the env files (shared by every rank, then this rank's declared keys)",
            "action": "env_files", "status": status, "changed": bool(result.get("changed")), "handler": False,
            "planner": False, "delegated": False, "state": "", "item": None, "msg": result.get("msg", ""),
            "diff": result.get("diff"), "result": result}


def test_drift_shows_one_row_a_file_named_as_the_template_loop_named_them(tmp_path):
    run_module(MODULE, args(tmp_path))
    out = run_module(MODULE, args(tmp_path, shared={"PORT": "9999"}), check_mode=True, diff=True)
    rows = drift.rows_for(_record(out.result))
    shared, rank = str(tmp_path / "sparkfleet.env"), str(tmp_path / "sparkfleet-rank.env")
    assert [r["item"] for r in rows] == [
        f"engine_env Render the env files (shared by every rank, then this rank's declared keys) [{shared}]",
        f"engine_env Render the env files (shared by every rank, then this rank's declared keys) [{rank}]"]
    assert rows[0]["drifted"] and rows[0]["desired"] == "PORT=9999" and rows[0]["actual"] == "PORT=8888"
    assert not rows[1]["drifted"] and rows[1]["actual"] == "same"


def test_drift_shows_a_failed_run_as_one_drifted_row(tmp_path):
    out = run_module(MODULE, args(tmp_path / "absent"), check_mode=True)
    (row,) = drift.rows_for(_record(out.result, status="failed"))
    assert row["drifted"] and "does not exist" in row["actual"]


def test_drift_shows_a_mode_change_on_its_own_file_even_in_a_folder_named_with_a_parenthesis(tmp_path):
    folder = tmp_path / "fleet (spark2)"
    folder.mkdir()
    run_module(MODULE, args(folder))
    os.chmod(folder / "sparkfleet-rank.env", 0o644)
    out = run_module(MODULE, args(folder), check_mode=True, diff=True)
    shared, rank = drift.rows_for(_record(out.result))
    assert not shared["drifted"] and shared["actual"] == "same"
    assert rank["item"].endswith(f"[{folder / 'sparkfleet-rank.env'}]")
    assert rank["drifted"] and "0640" in rank["desired"] and "0644" in rank["actual"], rank
