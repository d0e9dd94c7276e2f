#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_container
short_description: Compare, start, restart or stop one serving-engine container (a TP rank) and wait for its ready line
description:
  - Compares one engine container (the head's or a worker's, named by the inventory's C(fleet_head_container) and
    C(fleet_worker_container), docs/reference.md section 2) with the desired one, starts, restarts or stops it with
    the docker CLI, and optionally waits for a log line of this start.
  - It B(never creates, recreates or removes) a container. roles/engine makes them with
    C(community.docker.docker_container); with O(state=started) a missing or differing container is an error naming
    its differences (check mode reports it as RV(action=create) or RV(action=recreate), the rank's plan).
  - C(docker inspect) is the truth. A container differs when its image id, its managed env or its mounts differ from
    the desired ones; run flags and labels are compared by C(community.docker.docker_container), not here.
  - Managed env means every key of O(env) plus every key of the container's env that its image does not set
    (or sets to another value); the image's own C(ENV) (C(PATH), C(PYTHONPATH)...) that docker merges into
    C(Config.Env) is left out of the comparison. A key added by hand with C(-e) therefore shows up as a difference.
  - A start (start, restart) records how many log lines the container had, so O(wait_for) only
    looks at lines this boot wrote.
version_added: "0.1.0"
author: sparkfleet contributors (!UNKNOWN)
options:
  name:
    description: Container name.
    type: str
    required: true
  state:
    description:
      - C(started) starts the container when stopped (O(restart) restarts a running one); a missing or differing
        container fails (in check mode RV(action) is C(create) or C(recreate)).
      - C(stopped) stops it when running (C(docker stop -t O(stop_timeout))); it is kept with its log.
    type: str
    choices: [started, stopped]
    default: started
  image:
    description: Image reference the container must run. Required with O(state=started); it must be on the host.
    type: str
  env:
    description:
      - The env the container must have (keys sparkfleet manages). Values are strings without newlines.
    type: dict
    default: {}
  mounts:
    description: C(SRC:DST[:ro]) bind mounts (SRC an absolute host path) or volumes (SRC a volume name).
    type: list
    elements: str
    default: []
  restart:
    description: With O(state=started), stop and start a container that already matches and runs (a fresh boot).
    type: bool
    default: false
  wait_for:
    description:
      - With O(state=started), a Python regular expression; the module polls C(docker logs) until a line written
        since this start matches (when the container was not started by this run, any line counts).
      - The module fails when the container exits first or O(wait_timeout) passes, with the last log lines.
    type: str
  wait_timeout:
    description: Seconds to wait for O(wait_for). Must be more than 0.
    type: int
    default: 3600
  wait_extend_for:
    description:
      - A Python regular expression; once a line written since this start matches it (the engine retuning its
        FlashInfer autotune caches, which can take ~36 minutes on a first boot), O(wait_extended_timeout) applies
        instead of O(wait_timeout), counted from the same start.
    type: str
  wait_extended_timeout:
    description: Seconds to wait for O(wait_for) once O(wait_extend_for) matched; not less than O(wait_timeout).
    type: int
  stop_timeout:
    description: Seconds C(docker stop) gives the engine before it kills it.
    type: int
    default: 30
  log_tail:
    description: How many log lines to return in RV(log_tail) when waiting.
    type: int
    default: 30
  docker:
    description: The docker CLI to call.
    type: path
    default: docker
  secret_env_keys:
    description:
      - Env keys whose values are secrets besides those that look secret (C(*_KEY), C(*_TOKEN), C(*_SECRET),
        C(*PASSWORD*), C(API_KEY)); the roles pass C(sparkfleet_secret_env_keys).
      - Secret values are shown as C(********) in every result field, RV(differences) and the diff; URLs are shown
        without their C(user:password@).
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    description: Inspects the container and the image, computes RV(action), RV(differences) and the diff, and
      changes nothing (no start, stop or wait).
  diff_mode:
    support: full
    description: Image, state, managed env and mounts before and after, as text.
notes:
  - The desired image must already be on the host (the testbed and the fleet have no registry); the module never pulls.
  - Engine ranks rendezvous at boot, so restarting one rank alone is seldom useful; roles/engine decides which
    ranks boot and in which order (workers first, then the head).
seealso:
  - module: boot_log_info
  - module: community.docker.docker_container
"""

EXAMPLES = r"""
- name: Compare this worker's engine container with the desired one (the rank's plan, with the diff)
  engine_container:
    name: "{{ fleet_worker_container }}"
    image: dsv41-3x-spark:local
    env: "{{ engine_env_desired }}"
    mounts:
      - dsv41-weights:/models/DeepSeek-V4.1-Flash:ro
      - /home/zurih/dsv41-3x-spark/state:/state
      - /home/zurih/.cache:/root/.cache
      - /home/zurih/dsv41-3x-spark/engram:/engram
  check_mode: true
  register: plan

- name: Boot the head (made by community.docker.docker_container) and wait for its ready line
  engine_container:
    name: "{{ fleet_head_container }}"
    image: dsv41-3x-spark:local
    env: {NODE_RANK: "0", TP_SIZE: "3"}
    restart: true
    wait_for: '^.*Ready: API on port'
    wait_timeout: 600
  register: head

- name: Stop the head, keeping the container and its log
  engine_container:
    name: "{{ fleet_head_container }}"
    state: stopped
"""

RETURN = r"""
action:
  description: What was (or in check mode would be) done; C(create) and C(recreate) only in check mode (the plan).
  returned: always
  type: str
  choices: [none, create, recreate, start, restart, stop]
  sample: recreate
differences:
  description: Why a container differs, one entry per differing image id, env key or mount destination
    (C(null) means absent on that side).
  returned: always
  type: list
  elements: dict
  sample: [{what: env, key: DSV41_AUTOTUNE_KEEP, desired: "1", actual: null},
           {what: mount, key: /engram, desired: "/home/zurih/dsv41-3x-spark/engram:/engram", actual: null}]
container:
  description: The container as it was before this run (C(null) when absent); C(env) holds only managed keys.
  returned: always
  type: dict
  sample: {id: "4f2c...", name: dsv41-worker, image: "dsv41-3x-spark:local", image_id: "sha256:77ab...",
           status: running, running: true, exit_code: 0, started_at: "2026-11-29T10:01:02.123456Z",
           finished_at: "0001-01-01T00:00:00Z", env: {NODE_RANK: "1", TP_SIZE: "3"},
           mounts: ["/home/zurih/.cache:/root/.cache"]}
container_after:
  description: The container as this run left it (C(null) when absent), read back after the change and the wait;
    same keys as RV(container). What the run record keeps as the rank's state.
  returned: when not in check mode
  type: dict
image_id:
  description: Id of the desired image on this host.
  returned: when state is started
  type: str
  sample: sha256:77ab0c3f...
image_labels:
  description: Labels of the desired image (the engine and FlashInfer versions, where the image carries them).
  returned: when state is started
  type: dict
  sample: {engine.version: "0.5.4.post2+dsv41", flashinfer.version: "0.5.2"}
log_offset:
  description: Log lines the container had before this run started it (what O(wait_for) skips).
  returned: when the container was started by this run
  type: int
  sample: 57
ready:
  description: Whether the O(wait_for) line appeared (C(null) without O(wait_for) or in check mode).
  returned: always
  type: bool
  sample: true
ready_line:
  description: The matching log line.
  returned: when ready
  type: str
  sample: "[2026-11-29 10:01:04 TP0] Ready: API on port 8888 (rank 0), no API key."
wait_s:
  description: Seconds spent waiting for O(wait_for).
  returned: when waiting
  type: float
  sample: 2.4
wait_timeout_s:
  description: The timeout that applied to the wait (O(wait_extended_timeout) once O(wait_extend_for) matched).
  returned: when waiting
  type: float
  sample: 900
retuning:
  description: Whether a line matched O(wait_extend_for) during the wait, with that line in RV(retuning_line).
  returned: when waiting with O(wait_extend_for)
  type: bool
  sample: true
retuning_line:
  description: The first line that matched O(wait_extend_for).
  returned: when RV(retuning) is true
  type: str
  sample: "[2026-11-29 10:01:02 TP0] Running FlashInfer autotune with cache: /root/.cache/sglang/flashinfer/autotune/..."
log_tail:
  description: The last O(log_tail) lines written since the start (on success and on failure).
  returned: when waiting
  type: list
  elements: str
  sample: ["[2026-11-29 10:01:02 TP0] RuntimeError: CUDA error: out of memory (NV_ERR_NO_MEMORY) ..."]
exit_code:
  description: Exit code of a container that stopped while the module waited for it.
  returned: when the container exited during the wait
  type: int
  sample: 1
msg:
  description: One line saying what happened.
  returned: always
  type: str
  sample: "dsv41-worker: would recreate (2 differences: env DSV41_AUTOTUNE_KEEP, mount /engram)"
"""

import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.env_text import mask_tree, secret_values
from ansible.module_utils.engine_container import (
    Desired,
    Docker,
    EngineContainerError,
    apply,
    check_desired,
    current_summary,
    parse_mount,
    plan,
    wait_for_line,
)

PAST = {"none": "unchanged", "start": "started", "restart": "restarted", "stop": "stopped"}
FUTURE = {"none": "unchanged", "create": "would create", "recreate": "would recreate", "start": "would start",
          "restart": "would restart", "stop": "would stop"}


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            state=dict(type="str", default="started", choices=["started", "stopped"]),
            image=dict(type="str"),
            env=dict(type="dict", default={}),
            mounts=dict(type="list", elements="str", default=[]),
            restart=dict(type="bool", default=False),
            wait_for=dict(type="str"),
            wait_timeout=dict(type="int", default=3600),
            wait_extend_for=dict(type="str"),
            wait_extended_timeout=dict(type="int"),
            stop_timeout=dict(type="int", default=30),
            log_tail=dict(type="int", default=30),
            docker=dict(type="path", default="docker"),
            secret_env_keys=dict(type="list", elements="str", default=[], no_log=False),
        ),
        required_if=[("state", "started", ("image",))],
        supports_check_mode=True,
    )
    p = module.params
    name, state = p["name"], p["state"]
    result = dict(changed=False, action="none", differences=[], container=None, ready=None)
    # Every secret value this run sees (desired and actual), masked in whatever the module returns.
    secrets = secret_values(p["env"], p["secret_env_keys"])

    def masked(res: dict) -> dict:
        # The module's own echo of its arguments (invocation, shown with -v) is masked as well.
        return mask_tree(dict(res, invocation={"module_args": p}), secrets, p["secret_env_keys"])

    def fail(msg: str, **extra) -> None:
        result.update(extra)
        result.pop("msg", None)
        module.fail_json(msg=f"{name}: {msg}", **masked(result))

    def done() -> None:
        module.exit_json(**masked(result))

    if p["wait_timeout"] <= 0:
        fail(f"wait_timeout must be more than 0 seconds, got {p['wait_timeout']}")
    if p["wait_extended_timeout"] is not None and p["wait_extended_timeout"] < p["wait_timeout"]:
        fail(f"wait_extended_timeout ({p['wait_extended_timeout']} s) must not be less than wait_timeout "
             f"({p['wait_timeout']} s)")
    try:
        desired = Desired(name=name, image=p["image"] or "",
                          env={str(k): "" if v is None else str(v) for k, v in p["env"].items()},
                          mounts=[parse_mount(m) for m in p["mounts"]])
        check_desired(desired, need_image=state == "started")
    except EngineContainerError as exc:
        fail(str(exc), **exc.facts)

    docker = Docker(lambda argv: module.run_command(argv), p["docker"])
    try:
        the_plan = plan(docker, desired, state, p["restart"])
    except EngineContainerError as exc:
        fail(str(exc), **exc.facts)
    secrets += secret_values((the_plan.container or {}).get("env") or {}, p["secret_env_keys"])
    result.update(action=the_plan.action, differences=[d.as_dict() for d in the_plan.differences],
                  container=the_plan.container, changed=the_plan.action != "none")
    if the_plan.image_id:
        result.update(image_id=the_plan.image_id, image_labels=the_plan.image_labels)
    if module._diff and result["changed"]:
        result["diff"] = {"before_header": f"{name} (docker inspect)", "after_header": f"{name} (desired)",
                          "before": the_plan.before, "after": the_plan.after}
    why = ""
    if the_plan.differences:
        shown = ", ".join(f"{d.what} {d.key}" for d in the_plan.differences[:6])
        more = len(the_plan.differences) - 6
        why = f" ({len(the_plan.differences)} difference{'s' if len(the_plan.differences) != 1 else ''}: {shown}" \
              + (f", and {more} more" if more > 0 else "") + ")"
    if not module.check_mode and the_plan.action in ("create", "recreate"):
        fail(f"the container is {'missing' if the_plan.action == 'create' else 'different from the desired one'}"
             f"{why}: this module does not create containers; create it first (roles/engine: "
             "community.docker.docker_container)")
    words = FUTURE if module.check_mode else PAST
    result["msg"] = f"{name}: {words[the_plan.action]}{why}"
    if module.check_mode:
        done()

    try:
        offset = apply(docker, desired, the_plan, p["stop_timeout"])
    except EngineContainerError as exc:
        fail(f"{the_plan.action} failed: {exc}", **exc.facts)
    started = the_plan.action in ("start", "restart")
    if started:
        result["log_offset"] = offset

    if state == "started" and p["wait_for"]:
        try:
            waited = wait_for_line(docker, name, p["wait_for"], p["wait_timeout"], offset if started else 0,
                                   tail_lines=p["log_tail"], extend_pattern=p["wait_extend_for"],
                                   extended_timeout=p["wait_extended_timeout"])
        except (EngineContainerError, re.error) as exc:
            fail(f"waiting for {p['wait_for']!r} failed: {exc}", **getattr(exc, "facts", {}))
        result.update(ready=waited.ready, wait_s=round(waited.seconds, 3), log_tail=waited.tail,
                      wait_timeout_s=waited.timeout)
        if p["wait_extend_for"]:
            result["retuning"] = waited.extended
            if waited.extended:
                result["retuning_line"] = waited.extend_line
        if waited.ready:
            result["ready_line"] = waited.line
            result["msg"] += f"; ready after {waited.seconds:.1f} s"
        else:
            last = "\n".join(waited.tail[-10:])
            if not waited.running:
                fail(f"the container exited with code {waited.exit_code} before printing a line matching "
                     f"{p['wait_for']!r}\nlast lines:\n{last}", exit_code=waited.exit_code)
            why = ""
            if p["wait_extend_for"]:
                why = ("; the boot showed retuning, so the autotune timeout applied" if waited.extended else
                       "; the boot showed no autotune retuning, so the ordinary timeout applied")
            fail(f"no line matching {p['wait_for']!r} after {waited.timeout:g} s (the container still runs{why})\n"
                 f"last lines:\n{last}")
    try:
        result["container_after"] = current_summary(docker, desired)
    except EngineContainerError as exc:
        fail(f"reading the container back after {the_plan.action} failed: {exc}", **exc.facts)
    done()


if __name__ == "__main__":
    main()
