#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# sparkfleet: build the adapter bundle's manifest on the controller. Logic: module_utils/adapter_bundle.py.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: adapter_bundle
short_description: Describe the engine's adapter bundle (adapters plus kernels) by a manifest and check its pins
description:
  - Walks the operator's adapter directory (bundled as C(adapter/<file>)), sparkfleet's kernels package (as
    C(kernels/<file>)) and any extra files, and describes every file by path, size and sha256. The bundle hash is
    the sha256 of that manifest (canonical JSON, files sorted by path), so the same files always give the same
    hash and one changed byte gives another.
  - Refuses bad input with one message naming every problem - a directory that does not exist, a symlink that
    points outside its bundle directory, a dangling symlink, a file that cannot be read (or has no read
    permission), a fifo/socket/device - before anything is copied anywhere.
  - Checks O(pins) - bundle paths that must have a given sha256 - and fails naming the file and both hashes, or a
    pinned file that is not in the bundle.
  - "Read-only; run it on the controller (C(delegate_to: localhost))."
version_added: "1.0.0"
author: sparkfleet contributors (!UNKNOWN)
options:
  adapter_dir:
    description: The adapter directory (the operator's recipe checkout on the controller); bundled as C(adapter/).
    type: path
    required: true
  kernels_dir:
    description: sparkfleet's kernels package; bundled as C(kernels/). Omit for no kernels.
    type: path
  extra_files:
    description: More files, bundle path (relative, outside C(adapter/) and C(kernels/)) to controller path.
    type: dict
    default: {}
  exclude:
    description: Name patterns (fnmatch) left out at any depth.
    type: list
    elements: str
    default: ['__pycache__', '*.pyc', '*.pyo', '.*']
  pins:
    description: Bundle path (C(adapter/wo_a_w8.py)) to the sha256 the file must have.
    type: dict
    default: {}
  archive_dir:
    description: >-
      When given, also write the bundle as one archive, C(<archive_dir>/bundle-<hash12>.tar) (uncompressed tar of the
      files and the manifest, byte-identical for the same bundle), to copy to the nodes (the C(archive) option of M(adapter_release)).
      Not written in check mode (the role runs this task with C(check_mode: false): the archive is the run folder's
      evidence, nothing the fleet runs).
    type: path
attributes:
  check_mode:
    support: full
    description: Check mode computes and checks exactly the same and writes no archive.
  diff_mode:
    support: none
    description: Nothing is changed, so there is no diff.
"""

EXAMPLES = r"""
- name: Build the bundle manifest and check the pins
  adapter_bundle:
    adapter_dir: /home/mia/dsv41-3x-spark/adapter
    kernels_dir: "{{ playbook_dir }}/../kernels"
    extra_files:
      adapter_selftest.py: "{{ role_path }}/files/adapter_selftest.py"
    pins:
      adapter/wo_a_w8.py: 8d5c2f0e4b1a...   # the fleet's local TP3 file, never the TP4 one
  delegate_to: localhost
  run_once: true
  register: bundle
"""

RETURN = r"""
bundle:
  description: The bundle hash (sha256 over the manifest).
  returned: success
  type: str
  sample: 3f9a0c1d2e4b5a6978877665544332211ffeeddccbbaa99887766554433221100
bundle_short:
  description: The first 12 hex digits of the bundle hash (image tags carry them).
  returned: success
  type: str
  sample: 3f9a0c1d2e4b
manifest:
  description: The manifest nodes and images carry (format, bundle, files with path, size, sha256).
  returned: success
  type: dict
  sample: {format: 1, bundle: 3f9a0c1d..., files: [{path: adapter/wo_a_w8.py, size: 190, sha256: 8d5c...}]}
preview:
  description: Bundle path to text for every small UTF-8 file (64 KiB or less), for check-mode diffs on the nodes.
  returned: success
  type: dict
  sample: {adapter/wo_a_w8.py: "GATE = \"DSV41_WO_A_W8\"\n"}
manifest_text:
  description: The manifest file's exact text (identical on every node, so every node builds the same image).
  returned: success
  type: str
  sample: "{\n \"bundle\": \"3f9a...\",\n ...}\n"
files:
  description: Every bundled file with its controller path (C(source)) besides path, size and sha256.
  returned: success
  type: list
  elements: dict
  sample: [{path: adapter/wo_a_w8.py, size: 190, sha256: 8d5c..., source: /home/mia/dsv41-3x-spark/adapter/wo_a_w8.py}]
total_bytes:
  description: Bytes of all bundled files.
  returned: success
  type: int
  sample: 28756
pins:
  description: One entry per pin, with the pinned and the actual sha256 (also on a pin failure).
  returned: success, and failure by a pin
  type: list
  elements: dict
  sample: [{path: adapter/wo_a_w8.py, pinned: 8d5c..., sha256: 8d5c..., ok: true}]
archive:
  description: The archive written (or already identical) under O(archive_dir) - path, sha256, bytes, written.
  returned: success and O(archive_dir) is given, not in check mode
  type: dict
  sample: {path: runs/20250101-adapters/adapters/bundle-3f9a0c1d2e4b.tar, sha256: 77e1..., bytes: 51200, written: true}
problems:
  description: On failure, every problem found (the message joins them).
  returned: failure
  type: list
  elements: str
  sample: ["adapter/x.py is a symlink to /etc/passwd (/etc/passwd), outside the bundle directory ..."]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.adapter_bundle import DEFAULT_EXCLUDE, BundleError, build, write_archive


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            adapter_dir=dict(type="path", required=True),
            kernels_dir=dict(type="path"),
            extra_files=dict(type="dict", default={}),
            exclude=dict(type="list", elements="str", default=list(DEFAULT_EXCLUDE)),
            pins=dict(type="dict", default={}),
            archive_dir=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        bundle = build(p["adapter_dir"], p["kernels_dir"], {k: str(v) for k, v in p["extra_files"].items()},
                       p["exclude"], {k: str(v) for k, v in p["pins"].items()})
        result = bundle.as_result()
        if p["archive_dir"] and not module.check_mode:
            result["archive"] = write_archive(bundle, p["archive_dir"])
    except BundleError as exc:
        module.fail_json(msg=exc.msg, **exc.extra)
    except OSError as exc:
        module.fail_json(msg=f"cannot write the bundle archive under {p['archive_dir']}: {exc}")
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
