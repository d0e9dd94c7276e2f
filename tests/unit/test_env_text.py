"""module_utils/env_text: env keys and values, env files read with \\n only, secret masking (issue 19 items 12, 13),
and the engine_env filters and engine_container module that use it."""
from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import ROOT

from ansible.module_utils import engine_container as ec
from ansible.module_utils import env_text as et

_spec = importlib.util.spec_from_file_location(
    "sparkfleet_filter_engine_env_text", ROOT / "plugins" / "filter" / "engine_env.py")
envf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(envf)

# Every separator str.splitlines() honours, plus NUL.
SEPARATORS = ["\n", "\r", "\r\n", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\0"]


def test_line_breaks_are_exactly_what_splitlines_splits_on():
    splitting = {chr(c) for c in range(0x110000) if len(f"a{chr(c)}b".splitlines()) > 1}
    assert splitting | {"\0"} == set(et.LINE_BREAKS)


@pytest.mark.parametrize("sep", SEPARATORS)
def test_a_value_with_any_line_break_is_refused_everywhere(sep):
    value = f"x{sep}INJECTED=1"
    assert "line break" in et.value_problem("engine_env.A", value)
    problems = envf.engine_env_problems({"A": value, "TP_SIZE": "3"}, {"NODE_RANK": "0"}, 0, 3)
    assert any("engine_env.A" in p and "line break" in p for p in problems), problems
    desired = ec.Desired(name="dsv41-head", image="dsv41:1", env={"A": value})
    with pytest.raises(ec.EngineContainerError, match="line break"):
        ec.check_desired(desired, need_image=True)


@pytest.mark.parametrize("key", ["1A", "A-B", "A B", "A=B", "", "É", "A\u2028B", "A\n"])
def test_bad_keys_are_refused(key):
    assert et.key_problem("engine_env key", key)
    with pytest.raises(ec.EngineContainerError, match="not a valid variable name"):
        ec.check_desired(ec.Desired(name="c", image="i:1", env={key: "1"}), need_image=True)


def test_good_keys_and_values_pass():
    assert et.key_problem("k", "_A1") is None and et.value_problem("v", "a=b c\t#d") is None


@pytest.mark.parametrize("sep", ["\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
def test_env_file_parse_sees_no_phantom_key(sep):
    # docker --env-file splits at \n only: the rest of the line is the value, not a second key.
    text = f"A=x{sep}B=injected\nC=3\r\n# D=4\n  E=5\n"
    parsed = envf.engine_env_parse(text)
    assert parsed == {"A": f"x{sep}B=injected", "C": "3", "E": "5"}
    assert et.parse_env_file(text) == parsed


@pytest.mark.parametrize("key, secret", [
    ("OPENAI_API_KEY", True), ("API_KEY", True), ("HF_TOKEN", True), ("AWS_SECRET", True), ("DB_PASSWORD", True),
    ("PASSWORD_FILE_X", True), ("hf_token", True), ("NCCL_IB_HCA", False), ("DSV41_AUTOTUNE_KEEP", False),
    ("KEYS", False), ("TOKENIZER", False), ("MY_CREDENTIAL", False),
])
def test_secret_keys(key, secret):
    assert et.is_secret_key(key) is secret


def test_extra_secret_keys():
    assert et.is_secret_key("MY_CREDENTIAL", ["my_credential"])
    assert et.mask_env({"MY_CREDENTIAL": "c", "A": "1"}, ["MY_CREDENTIAL"]) == {"MY_CREDENTIAL": et.MASK, "A": "1"}


def test_mask_env_dict_and_docker_list():
    env = {"HF_TOKEN": "hf_abc", "PROXY": "http://u:p4ss@proxy:3128/x", "A": "1"}
    assert et.mask_env(env) == {"HF_TOKEN": "********", "PROXY": "http://proxy:3128/x", "A": "1"}
    assert et.mask_env(["HF_TOKEN=hf_abc", "A=1=2", "PATH"]) == ["HF_TOKEN=********", "A=1=2", "PATH"]


@pytest.mark.parametrize("text, shown", [
    ("https://user:pw@host/p", "https://host/p"), ("redis://:pw@r:6379/0", "redis://r:6379/0"),
    ("a http://u@h b https://x:y@g/?q=a@b", "a http://h b https://g/?q=a@b"),
    ("mail me@example.com", "mail me@example.com"), ("http://host/a@b", "http://host/a@b"),
])
def test_url_credentials_removed(text, shown):
    assert et.strip_url_credentials(text) == shown


def test_mask_text_replaces_secret_values():
    text = "env:\n  HF_TOKEN=hf_secret_value\n  A=1\n  URL=http://u:pw@h/\n"
    out = et.mask_text(text, {"HF_TOKEN": "hf_secret_value", "A": "1"})
    assert "hf_secret_value" not in out and "HF_TOKEN=********" in out and "u:pw" not in out and "A=1" in out


def test_mask_tree_masks_every_place_a_secret_sits():
    result = {"container": {"env": {"HF_TOKEN": "hf_live_1234", "A": "1"}},
              "differences": [{"what": "env", "key": "HF_TOKEN", "desired": "hf_new_5678", "actual": "hf_live_1234"},
                              {"what": "env", "key": "A", "desired": "2", "actual": "1"}],
              "diff": {"before": "env:\n  HF_TOKEN=hf_live_1234\n", "after": "env:\n  HF_TOKEN=hf_new_5678\n"},
              "msg": "recreated (env HF_TOKEN)", "argv": ["-e", "HF_TOKEN=hf_new_5678", "-e", "A=2"],
              "proxy": "http://bob:pw@proxy:3128"}
    masked = et.mask_tree(result, ["hf_new_5678", "hf_live_1234"])
    text = repr(masked)
    assert "hf_live_1234" not in text and "hf_new_5678" not in text and "bob:pw" not in text
    assert masked["differences"][1] == {"what": "env", "key": "A", "desired": "2", "actual": "1"}
    assert masked["container"]["env"] == {"HF_TOKEN": et.MASK, "A": "1"}
    assert masked["argv"] == ["-e", "HF_TOKEN=********", "-e", "A=2"] and masked["msg"] == result["msg"]
    assert result["container"]["env"]["HF_TOKEN"] == "hf_live_1234"  # a copy: the caller's data is untouched


def test_secret_values():
    assert et.secret_values({"HF_TOKEN": "t", "A": "1"}) == ["t"]
    assert et.secret_values(["MY_PASSWORD=p=q", "A=1"]) == ["p=q"]


def test_mask_tree_masks_short_secrets_in_env_text():
    text = "env:\n  API_KEY=k9\n  A=1\nrun -e HF_TOKEN=x -e B=2"
    assert et.mask_tree(text) == "env:\n  API_KEY=********\n  A=1\nrun -e HF_TOKEN=******** -e B=2"
