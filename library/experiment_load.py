#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# sparkfleet: load and check one experiment of the catalog (runs on the controller).
from __future__ import annotations

DOCUMENTATION = r"""
---
module: experiment_load
short_description: Load one experiment of the catalog, validate it and check its prerequisites
description:
  - Reads C(experiments/<name>.yml) (or O(file)), validates it against the schema of
    C(module_utils/experiments.py), and checks that every prerequisite is kept in the incumbent.
  - "Runs on the controller (C(delegate_to: localhost) or a localhost play); reads only."
version_added: "1.0.0"
author: sparkfleet contributors (!UNKNOWN)
options:
  name:
    description: Experiment name (a file in O(catalog)). One of O(name) and O(file) is required.
    type: str
  file:
    description: Path of an experiment file outside the catalog (its prerequisites still come from O(catalog)).
    type: path
  catalog:
    description: The catalog folder.
    type: path
    required: true
  kept:
    description: Experiments kept in the incumbent configuration.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    description: Reads only; the same in check mode.
  diff_mode:
    support: none
    description: Nothing changes.
"""

EXAMPLES = r"""
- name: Load wo_a_w8_mid and check that wo_a_w8 is kept
  experiment_load:
    name: wo_a_w8_mid
    catalog: "{{ playbook_dir }}/../experiments"
    kept: "{{ incumbent_experiments | default([]) }}"
  delegate_to: localhost
  register: experiment
"""

RETURN = r"""
experiment:
  description: The experiment, as in its file.
  returned: success
  type: dict
  sample: {name: wo_a_w8_mid, stage: D, apply: {env: {DSV41_WO_A_W8: "1", DSV41_WO_A_MID: "1"}}}
catalog_names:
  description: Every experiment in the catalog.
  returned: always
  type: list
  elements: str
  sample: [autotune_keep, pack_engram]
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.experiments import missing_prerequisites, validate

try:
    import yaml
except ImportError:  # the controller's venv has PyYAML; a bare host does not
    yaml = None


def _load(path):
    with open(path) as fh:
        return yaml.safe_load(fh)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(name=dict(type="str"), file=dict(type="path"), catalog=dict(type="path", required=True),
                           kept=dict(type="list", elements="str", default=[])),
        required_one_of=[("name", "file")], mutually_exclusive=[("name", "file")], supports_check_mode=True)
    p = module.params
    if yaml is None:
        module.fail_json(msg="experiment_load runs on the controller (it needs PyYAML): delegate it to localhost")
    catalog = {}
    for entry in sorted(os.listdir(p["catalog"])):
        if entry.endswith(".yml"):
            try:
                catalog[entry[:-4]] = _load(os.path.join(p["catalog"], entry))
            except (OSError, yaml.YAMLError) as exc:
                module.fail_json(msg=f"cannot read experiments/{entry}: {exc}")
    names = sorted(catalog)
    if p["name"]:
        if p["name"] not in catalog:
            module.fail_json(msg=f"unknown experiment {p['name']!r}; the catalog has: {', '.join(names)}",
                             catalog_names=names)
        doc, label, file_name = catalog[p["name"]], f"experiments/{p['name']}.yml", p["name"]
    else:
        try:
            doc = _load(p["file"])
        except (OSError, yaml.YAMLError) as exc:
            module.fail_json(msg=f"cannot read experiment file {p['file']}: {exc}", catalog_names=names)
        label, file_name = p["file"], os.path.splitext(os.path.basename(p["file"]))[0]
    problems = validate(doc, file_name)
    if problems:
        module.fail_json(msg=f"{label} fails the experiment schema: " + "; ".join(problems), catalog_names=names)
    missing = missing_prerequisites(doc, p["kept"], catalog)
    if missing:
        module.fail_json(msg=f"{doc['name']} needs these experiments kept first: {', '.join(missing)} "
                             f"(kept now: {', '.join(p['kept']) or 'none'})", catalog_names=names)
    module.exit_json(changed=False, experiment=doc, catalog_names=names)


if __name__ == "__main__":
    main()
