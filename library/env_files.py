#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# sparkfleet: write a rank's docker env files in one module run. Logic: module_utils/env_files.py.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: env_files
short_description: Write docker env files (KEY=value lines) in one run, secrets masked in results and diffs
description:
  - Writes each file of O(files) as docker's C(--env-file) format - the O(header) comment, a comment saying what
    the file holds, a format comment, then one C(KEY=value) line a key sorted by key - and sets O(owner),
    O(group) and O(mode). roles/engine_env writes a rank's two serving env files with it (one module run a host
    in place of a template loop of two modules a file).
  - A file is replaced only when its text differs, through a temporary file in its folder with fsync, rename
    and a folder fsync; owner, group and mode are set when they differ.
  - Keys must be variable names and values one line (strings or numbers); a bad one fails before any file is
    written. A path that exists and is not a regular file is refused, never replaced.
  - Check mode reports what would change and changes nothing. With C(--diff), each changed file shows its text
    before and after; the values of secret keys (C(*_KEY), C(*_TOKEN), C(*_SECRET), C(*PASSWORD*), C(API_KEY)
    and O(secret_env_keys)) are masked there and in everything the module returns.
version_added: "0.2.0"
author: sparkfleet contributors (!UNKNOWN)
options:
  files:
    description: The files to write.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Absolute path of the file; its folder must exist.
        type: path
        required: true
      env:
        description: The keys and values the file holds.
        type: dict
        required: true
      what:
        description: What the file holds, one comment line.
        type: str
        default: ""
  header:
    description: Comment lines at the top (each line gets C(# ) unless it starts with C(#)), e.g. Ansible's managed string.
    type: str
    default: ""
  owner:
    description: Owner of the files.
    type: str
  group:
    description: Group of the files.
    type: str
  mode:
    description: Mode of the files, octal as a string.
    type: raw
    default: "0640"
  secret_env_keys:
    description: Keys whose values are secrets besides those that look secret.
    type: list
    elements: str
    default: []
notes:
  - Supports check mode and diff mode.
"""

EXAMPLES = r"""
- name: Render the serving env files
  env_files:
    header: "{{ lookup('config', 'DEFAULT_MANAGED_STR') | comment }}"
    files:
      - path: /home/dgx/dsv41/sparkfleet.env
        env: {PORT: "8888"}
        what: the serving env every rank shares
    owner: dgx
    group: dgx
    mode: "0640"
"""

RETURN = r"""
files:
  description: One entry a file, in the order of O(files).
  returned: always
  type: list
  elements: dict
  sample: [{"path": "/home/dgx/dsv41/sparkfleet.env", "changed": true, "created": false, "keys": 23}]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.env_files import EnvFileError, env_file_text, plan_file, secrets_of
from ansible.module_utils.env_text import mask_tree
from ansible.module_utils.file_io import write_atomic


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            files=dict(type="list", elements="dict", required=True, options=dict(
                path=dict(type="path", required=True),
                env=dict(type="dict", required=True),
                what=dict(type="str", default=""),
            )),
            header=dict(type="str", default=""),
            owner=dict(type="str"),
            group=dict(type="str"),
            mode=dict(type="raw", default="0640"),
            secret_env_keys=dict(type="list", elements="str", default=[], no_log=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    extra = p["secret_env_keys"]
    secrets = secrets_of([], [f["env"] for f in p["files"]], extra)
    result = dict(changed=False, files=[])

    def finish(fail_msg: str = None) -> None:
        out = mask_tree(dict(result, invocation={"module_args": p}), secrets, extra)
        if fail_msg:
            module.fail_json(msg=mask_tree(fail_msg, secrets, extra), **out)
        module.exit_json(**out)

    try:
        mode = int(str(p["mode"]), 8)
    except ValueError:
        finish(f"mode {p['mode']!r} is not an octal mode such as 0640")
    try:
        plans = [plan_file(f["path"], env_file_text(p["header"], f["what"], f["env"])) for f in p["files"]]
    except EnvFileError as exc:
        finish(str(exc))
    secrets += secrets_of([pl["before"] for pl in plans], [], extra)
    diffs = []
    for pl, wanted in zip(plans, p["files"]):
        path = pl["path"]
        created = pl["before"] is None
        changed = pl["content_changed"]
        if changed:
            diffs.append({"before_header": path, "after_header": path,
                          "before": pl["before"] or "", "after": pl["after"]})
            if not module.check_mode:
                try:
                    write_atomic(path, pl["after"], mode=mode)  # temporary file, fsync, rename, folder fsync
                except OSError as exc:
                    finish(f"{path}: cannot write it: {exc}")
        attrs = {"before": {}, "after": {}, "before_header": f"{path} (owner, group, mode)",
                 "after_header": f"{path} (owner, group, mode)"}
        if not module.check_file_absent_if_check_mode(path):
            file_args = module.load_file_common_arguments(dict(path=path, owner=p["owner"], group=p["group"],
                                                               mode="%04o" % mode))
            if module.set_fs_attributes_if_different(file_args, False, attrs, expand=False):
                changed = True
                if attrs["before"] and not created:
                    diffs.append(attrs)
        result["files"].append({"path": path, "changed": changed, "created": created,
                                "keys": len(wanted["env"])})
        result["changed"] = result["changed"] or changed
    if module._diff and diffs:
        result["diff"] = diffs
    finish()


if __name__ == "__main__":
    main()
