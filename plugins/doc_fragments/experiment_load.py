# -*- coding: utf-8 -*-
# sparkfleet: the experiment_load_info options (shared with the deprecated alias experiment_load).
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
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
"""
