#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: quiesce_workloads
short_description: Pause or stop the dispensable containers and services of a host, and undo exactly that
description:
  - Inventories every container (name, image, state, owner label) and the named services of the host.
  - With O(state=quiet), pauses or stops what O(dispensable) names and records each action in O(state_file);
    a workload that was already quiet is left alone and not recorded. Workloads recorded earlier that are no
    longer listed are put back as they were.
  - With O(state=restored), undoes exactly the recorded actions (unpause, start) and removes O(state_file).
  - Refuses, before changing anything, when O(dispensable) names a serving container (O(protected_names)) or a
    container started from one of O(protected_images).
  - A listed name that is neither a container nor a unit on this host is a warning, not a failure.
version_added: "0.1.0"
author: sparkfleet contributors (!UNKNOWN)
options:
  state:
    description: C(quiet) pauses or stops the listed workloads; C(restored) undoes what the record says.
    type: str
    choices: [quiet, restored]
    default: quiet
  dispensable:
    description:
      - Workloads that may be quiesced. Each is a container name (paused) or a dict with C(name), C(kind)
        (C(container) or C(service), default C(container)) and C(action) (C(pause) or C(stop); containers
        default to O(default_action), services can only be stopped).
    type: list
    elements: raw
    default: []
  default_action:
    description: Action for containers listed without one.
    type: str
    choices: [pause, stop]
    default: pause
  protected_names:
    description:
      - Serving containers that are never paused or stopped (the quiesce role passes quiesce_protected_containers,
        the inventory's fleet_head_container and fleet_worker_container).
    type: list
    elements: str
    required: true
  protected_images:
    description: Images whose containers are never paused or stopped (by reference or image id).
    type: list
    elements: str
    default: []
  inventory_services:
    description: Further services to report in RV(inventory) (never touched unless listed in O(dispensable)).
    type: list
    elements: str
    default: []
  owner_label:
    description: Container label reported as the owner.
    type: str
    default: owner
  state_file:
    description: Where the record of what this module did is kept on the host.
    type: path
    default: /var/lib/sparkfleet/quiesce.json
  warn_unknown:
    description: Warn about listed names that do not exist on this host.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    description: Reads the host and the record, reports the actions and the diff, changes nothing.
  diff_mode:
    support: full
    description: Shows each workload's state before and after, and the record file before and after.
notes:
  - Pausing freezes a container's processes (SIGSTOP through the cgroup freezer); they keep their memory.
    Stop a container to free its memory.
  - A paused container does not survive a Docker daemon restart or a reboot; re-run the converge after one.
"""

EXAMPLES = r"""
- name: Quiet the homelab containers and the dashboard during a measurement window
  quiesce_workloads:
    state: quiet
    dispensable:
      - grafana
      - prometheus
      - name: ollama
        action: stop
      - name: gpu-dashboard.service
        kind: service
    protected_images: ["{{ fleet_image }}"]
  register: quiet

- name: Put back exactly what was quiesced
  quiesce_workloads:
    state: restored
"""

RETURN = r"""
actions:
  description: What was done (or, in check mode, would be done), in order.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "grafana", "kind": "container", "verb": "pause", "from": "running", "to": "paused"}]
unknown:
  description: Listed (or recorded) names that are neither a container nor a service on this host.
  returned: always
  type: list
  elements: str
  sample: [jellyfin]
listed:
  description: Number of workloads in O(dispensable).
  returned: always
  type: int
  sample: 19
not_quiet:
  description: Names that were not in the desired state before this run (the drift).
  returned: always
  type: list
  elements: str
  sample: [grafana]
record:
  description: The content of O(state_file) after the run (null when there is nothing to remember).
  returned: always
  type: dict
  sample: {"version": 1, "state": "quiet", "actions": [{"name": "grafana", "kind": "container", "action": "pause",
           "from": "running"}]}
record_changed:
  description: Whether the record file changes (or, in check mode, would change).
  returned: always
  type: bool
  sample: true
state_file:
  description: Path of the record.
  returned: always
  type: str
  sample: /var/lib/sparkfleet/quiesce.json
inventory:
  description: Every container and the named services, as found before the run.
  returned: always
  type: dict
  sample: {"containers": [{"name": "grafana", "image": "grafana/grafana:11.2.0", "state": "running", "owner": "zurih",
           "dispensable": true}], "services": [{"name": "gpu-dashboard.service", "active": "active",
           "enabled": "enabled", "exists": true}]}
"""

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.quiesce_workloads import (
    QuiesceError, apply, describe, image_ids, inventory_containers, normalize, parse_record, partial_record, plan,
    protected, render_record, service_state)


def read_text(path: str):
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def write_record(module: AnsibleModule, path: str, text: str) -> None:
    if not text:
        if os.path.exists(path):
            os.unlink(path)
        return
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".quiesce-", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    module.atomic_move(tmp, path)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["quiet", "restored"], default="quiet"),
            dispensable=dict(type="list", elements="raw", default=[]),
            default_action=dict(type="str", choices=["pause", "stop"], default="pause"),
            protected_names=dict(type="list", elements="str", required=True),
            protected_images=dict(type="list", elements="str", default=[]),
            inventory_services=dict(type="list", elements="str", default=[]),
            owner_label=dict(type="str", default="owner"),
            state_file=dict(type="path", default="/var/lib/sparkfleet/quiesce.json"),
            warn_unknown=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    host = os.uname().nodename

    def run(argv: list) -> tuple:
        try:
            return module.run_command(argv, environ_update={"LC_ALL": "C"}, handle_exceptions=False,
                                      expand_user_and_vars=False)
        except OSError as exc:
            return 127, "", str(exc)

    try:
        entries = normalize(p["dispensable"], p["default_action"])
        old_text = read_text(p["state_file"])
        record = parse_record(old_text, p["state_file"])
        recorded = (record or {}).get("actions", [])
        needs_docker = any(e.kind == "container" for e in entries) or any(r["kind"] == "container" for r in recorded)
        try:
            containers = inventory_containers(run, p["owner_label"])
        except QuiesceError as exc:
            if needs_docker:
                raise QuiesceError(f"{host}: cannot list containers: {exc}") from exc
            containers = {}
        service_names = sorted({e.name for e in entries if e.kind == "service"}
                               | {r["name"] for r in recorded if r["kind"] == "service"}
                               | set(p["inventory_services"]))
        services = {name: service_state(run, name) for name in service_names}
        refused = protected(entries, containers, p["protected_names"], p["protected_images"],
                            image_ids(run, p["protected_images"]) if p["protected_images"] else set())
        if refused:
            raise QuiesceError(
                f"{host}: quiesce_dispensable names {', '.join(refused)}; serving containers are never paused or "
                "stopped by quiesce: remove them from quiesce_dispensable")
        result = plan(p["state"], entries, record, containers, services)
    except QuiesceError as exc:
        module.fail_json(msg=str(exc), state_file=p["state_file"])

    if result.unknown and p["warn_unknown"]:
        module.warn(f"{host}: quiesce_dispensable names {', '.join(sorted(result.unknown))}, which "
                    f"{'is' if len(result.unknown) == 1 else 'are'} neither a container nor a service here; skipped")

    new_text = render_record(result.record)
    changed = bool(result.actions) or new_text != (old_text or "")
    listed = {e.name for e in entries if e.kind == "container"}
    inventory = {
        "containers": [{**row, "dispensable": name in listed} for name, row in sorted(containers.items())],
        "services": [services[name] for name in service_names],
    }
    before, after = describe(result.actions)
    diff = [{"before_header": f"{host}: workloads", "after_header": f"{host}: workloads",
             "before": before, "after": after},
            {"before_header": p["state_file"], "after_header": p["state_file"],
             "before": old_text or "", "after": new_text}]
    outcome = dict(changed=changed, state=p["state"], actions=[a.as_dict() for a in result.actions],
                   unknown=sorted(result.unknown), listed=result.listed, not_quiet=result.not_quiet,
                   record=result.record, record_changed=new_text != (old_text or ""), state_file=p["state_file"],
                   inventory=inventory)
    if module._diff:
        outcome["diff"] = diff

    if module.check_mode or not changed:
        module.exit_json(**outcome)

    done, error = apply(run, result.actions)
    if error:
        partial = partial_record(p["state"], record, result.record, done)
        write_record(module, p["state_file"], render_record(partial))
        outcome.update(actions=[a.as_dict() for a in done], record=partial)
        module.fail_json(msg=f"{host}: {error}; {len(done)} of {len(result.actions)} actions done and recorded "
                             f"in {p['state_file']}. Fix the cause and re-run.", **outcome)
    if new_text != (old_text or ""):
        write_record(module, p["state_file"], new_text)
    module.exit_json(**outcome)


if __name__ == "__main__":
    main()
