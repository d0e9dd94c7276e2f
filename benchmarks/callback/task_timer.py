"""task_timer: where a playbook's wall time goes (benchmarks/preflight_bench.py --profile).

Prints, at the end of the run, the wall time from each task's start to the next task's start (so Ansible's
own per-task cost is counted with the task), the time before the first task (start-up, inventory) and the
total, slowest first. Enable with ANSIBLE_CALLBACK_PLUGINS=benchmarks/callback ANSIBLE_CALLBACKS_ENABLED=task_timer.
"""
from __future__ import annotations

DOCUMENTATION = r"""
name: task_timer
type: aggregate
short_description: wall time per task, slowest first (benchmarks only)
description:
  - Prints a table of every task's wall time (task start to next task start) at the end of the run.
requirements:
  - enable with ANSIBLE_CALLBACKS_ENABLED=task_timer
"""

import json
import os
import time

from ansible.plugins.callback import CallbackBase

T0 = time.monotonic()


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_timer"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.rows = []          # [name, start]
        self.first = None

    def _mark(self, name: str) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        self.rows.append([name, now])

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._mark(task.get_name())

    def v2_playbook_on_handler_task_start(self, task):
        self._mark("handler: " + task.get_name())

    def v2_playbook_on_play_start(self, play):
        self._mark("play: " + play.get_name())

    def v2_playbook_on_stats(self, stats):
        end = time.monotonic()
        out = []
        for i, (name, start) in enumerate(self.rows):
            stop = self.rows[i + 1][1] if i + 1 < len(self.rows) else end
            out.append({"task": name, "s": round(stop - start, 3)})
        report = {"startup_s": round((self.first or end) - T0, 3), "total_s": round(end - T0, 3),
                  "tasks": sorted(out, key=lambda r: -r["s"])}
        path = os.environ.get("TASK_TIMER_OUT")
        if path:
            with open(path, "w") as fh:
                json.dump(report, fh)
        else:
            self._display.display("task_timer: " + json.dumps(report, indent=1))
