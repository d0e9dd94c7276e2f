# -*- coding: utf-8 -*-
"""controller_file: write one file on the controller (a run folder's evidence: boot logs, bench results, records)
inside the task's worker, without running a module.

``ansible.builtin.copy`` with ``delegate_to: localhost`` runs two modules (stat, then copy) in a local Python for
every host of the task: about 0.5 s of controller CPU a host at load 3-4 on the testbed's 2-core controller, for a
file that the controller itself writes (docs/campaign.md "Fewer turns a rung (ov10)"). This action writes it with
module_utils/file_io.py's write_if_changed (crash-safe, the same bytes and mode as the copy wrote), truthfully in
check mode (reports the change, writes nothing) and
shows a diff with --diff as copy does. It always writes on the controller, whatever the task's host.

    - name: Save this rank's log in the run folder
      controller_file:
        dest: "{{ run_dir }}/boot-logs/{{ inventory_hostname }}.log"   # absolute; its folder must exist
        content: "{{ log_text }}"                                      # a string (other data is written as JSON)
        mode: "0644"                                                   # octal string, default 0644
        make_folders: true  # optional: make dest's missing folders (0755 each) first, as a file task would

``make_folders`` does what a ``file: state=directory`` task before it did, in the same task: a boot makes its
``boot-logs/<phase>`` folders with the first log it writes there instead of a task of its own (docs/campaign.md
"ov13"). Without it a missing folder is an error: a run writes its evidence where it said it would.
"""
from __future__ import annotations

import json
import os
import sys

from ansible import constants as C
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "module_utils"))
from file_io import write_if_changed  # noqa: E402


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("dest", "content", "mode", "make_folders"))
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        unknown = set(args) - self._VALID_ARGS
        dest, content, mode = args.get("dest"), args.get("content"), str(args.get("mode", "0644"))
        if unknown:
            raise AnsibleActionFail(f"controller_file: unknown option(s) {', '.join(sorted(unknown))}")
        if not isinstance(dest, str) or not os.path.isabs(dest):
            raise AnsibleActionFail(f"controller_file: dest must be an absolute path, got {dest!r}")
        if content is None:
            raise AnsibleActionFail("controller_file: content is required")
        if not isinstance(content, (str, bytes)):
            content = json.dumps(content)
        try:
            octal = int(mode, 8)
        except ValueError:
            raise AnsibleActionFail(f"controller_file: mode must be an octal string, got {mode!r}") from None
        make_folders = args.get("make_folders", False)
        if not isinstance(make_folders, bool):
            raise AnsibleActionFail(f"controller_file: make_folders must be true or false, got {make_folders!r}")
        text = content.decode("utf-8", "replace") if isinstance(content, bytes) else str(content)
        before = self._before(dest) if self._task.diff else None
        try:
            result.update(write_if_changed(dest, text, mode=octal, check=bool(self._task.check_mode),
                                           make_folders=make_folders))
        except OSError as exc:
            raise AnsibleActionFail(f"controller_file: cannot write {dest}: {exc}") from exc
        if before is not None and result.get("changed"):
            # As ansible.builtin.copy shows it: the old and the new text, or a note above the diff size limit.
            after = text if len(text.encode("utf-8")) <= C.MAX_FILE_SIZE_FOR_DIFF else "(the new content is too large to show)"
            result["diff"] = {"before": before, "after": after, "before_header": dest, "after_header": dest}
        return result

    @staticmethod
    def _before(dest: str) -> str:
        """The file's text now, for --diff: empty when it does not exist, a note when it is too large or unreadable."""
        try:
            if os.path.getsize(dest) > C.MAX_FILE_SIZE_FOR_DIFF:
                return "(the current file is too large to show)"
            with open(dest, "rb") as fh:
                return fh.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""
        except OSError as exc:
            return f"(cannot read the current file: {exc.strerror})"
