"""Run an Ansible module's main() in-process: set its arguments, capture exit_json/fail_json."""
from __future__ import annotations

import json
from contextlib import contextmanager
from unittest import mock

from ansible.module_utils import basic
from ansible.module_utils.common.text.converters import to_bytes


class ModuleExit(Exception):
    def __init__(self, result: dict, failed: bool):
        super().__init__(result.get("msg", ""))
        self.result = result
        self.failed = failed


@contextmanager
def module_args(args: dict, check_mode: bool = False, diff: bool = False):
    payload = dict(args)
    payload["_ansible_check_mode"] = check_mode
    payload["_ansible_diff"] = diff
    payload.setdefault("_ansible_remote_tmp", "/tmp")
    payload.setdefault("_ansible_keep_remote_files", False)
    # ansible-core 2.19 sends a serialization profile beside the arguments; "legacy" is what it gives
    # modules like ours.
    with mock.patch.object(basic, "_ANSIBLE_ARGS", to_bytes(json.dumps({"ANSIBLE_MODULE_ARGS": payload}))), \
            mock.patch.object(basic, "_ANSIBLE_PROFILE", "legacy"):
        yield


def _exit_json(self, **kwargs):
    kwargs.setdefault("changed", False)
    raise ModuleExit(kwargs, failed=False)


def _fail_json(self, msg, **kwargs):
    kwargs["msg"] = msg
    kwargs["failed"] = True
    raise ModuleExit(kwargs, failed=True)


def run_module(module, args: dict, check_mode: bool = False, diff: bool = False) -> ModuleExit:
    """Call ``module.main()`` and return the ModuleExit carrying its result (never raises it)."""
    with module_args(args, check_mode, diff), \
            mock.patch.object(basic.AnsibleModule, "exit_json", _exit_json), \
            mock.patch.object(basic.AnsibleModule, "fail_json", _fail_json):
        try:
            module.main()
        except ModuleExit as exc:
            return exc
    raise AssertionError("module returned without exit_json or fail_json")
