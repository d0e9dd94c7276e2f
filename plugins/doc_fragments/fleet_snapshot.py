# -*- coding: utf-8 -*-
# sparkfleet: the fleet_snapshot_info options (shared with the deprecated alias fleet_snapshot).
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  gather:
    description:
      - Sections to take. C(all) takes every section.
    type: list
    elements: str
    choices: [all, memory, load, gpu, boot, containers, serving, disks, files, units]
    default: [all]
  serving_names:
    description:
      - Container names that are serving containers (the inventory's fleet_head_container and fleet_worker_container);
        without them only O(serving_image) makes a container a serving one.
    type: list
    elements: str
    default: []
  serving_image:
    description:
      - The fleet's engine image (for example C(dsv41-3x-spark:local)). Any container started from it, by
        reference or by image id, is a serving container too.
    type: str
    default: ""
  owner_label:
    description: Container label whose value is reported as the container's owner.
    type: str
    default: owner
  volumes:
    description:
      - Volumes to measure, as name and path (for example C(engram) and C(archive)).
    type: dict
    default: {}
  files:
    description: Paths to describe (never followed when they are symbolic links).
    type: list
    elements: path
    default: []
  units:
    description: Systemd units whose enablement and activity to read.
    type: list
    elements: str
    default: []
  content_max_bytes:
    description: Return the text of a file in O(files) when it is at most this many bytes.
    type: int
    default: 65536
  secret_env_keys:
    description:
      - Env keys whose values are secrets besides those that look secret (C(*_KEY), C(*_TOKEN), C(*_SECRET),
        C(*PASSWORD*), C(API_KEY)); the playbooks pass C(sparkfleet_secret_env_keys).
      - Their values are returned as C(********), wherever they appear in the snapshot; URLs lose C(user:pass@).
    type: list
    elements: str
    default: []
"""
