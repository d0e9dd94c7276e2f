# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of the experiment_load_info module (and of its deprecated alias experiment_load): load one experiment
of the catalog, validate it (module_utils/experiments.py) and check its prerequisites. Runs on the controller."""
from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.experiments import load_data_yaml, missing_prerequisites, validate
from ansible.module_utils.module_alias import warn_if_deprecated

try:
    import yaml
except ImportError:  # the controller's venv has PyYAML; a bare host does not
    yaml = None


def _load(path):
    """An experiment file: the catalog's plain YAML, or one the campaign wrote with data_yaml (!unsafe strings)."""
    with open(path) as fh:
        return load_data_yaml(fh)


def run_module(name: str) -> None:
    """Load, validate and check the experiment the module's arguments name and exit with it."""
    module = AnsibleModule(
        argument_spec=dict(name=dict(type="str"), file=dict(type="path"), catalog=dict(type="path", required=True),
                           kept=dict(type="list", elements="str", default=[])),
        required_one_of=[("name", "file")], mutually_exclusive=[("name", "file")], supports_check_mode=True)
    warn_if_deprecated(module, name)
    p = module.params
    if yaml is None:
        module.fail_json(msg=f"{name} runs on the controller (it needs PyYAML): delegate it to localhost")
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

