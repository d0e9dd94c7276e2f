#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# sparkfleet: engine image releases of adapter bundles on one node. Logic: module_utils/adapter_release.py.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: adapter_release
short_description: Prepare, record, serve, keep and roll back the engine image of an adapter bundle on one node
description:
  - O(state=prepared) makes the build context hold exactly the bundle of O(manifest) (files from O(archive) are
    written where they differ, mode 0644; files under the directories the bundle owns, C(adapter/) and C(kernels/),
    that it does not list are removed; the manifest goes beside the Dockerfile) and decides whether the release
    image C(<image_repo>:bundle-<12 hex of the bundle hash>) must be built (C(build), C(build_reasons)), which it is not when that
    tag already holds a tested image of the same bundle, base image and Dockerfile. It builds nothing; the role
    builds C(candidate) with M(community.docker.docker_image), runs the in-image test with
    M(community.docker.docker_container) and moves the release tag to the candidate with
    M(community.docker.docker_image_tag) only after a pass.
  - O(state=tested) takes the in-image test's result (O(test_status), O(test_output)) of the candidate's image
    O(image_id). A pass records the release in C(<state_dir>/releases.json); anything else fails naming O(node) and
    the failing test (the release and serving tags were not moved, so nothing is put back).
  - O(state=serving) works out, read-only, what putting the release O(release) names into service takes on this
    node - the move of O(serving_image) (the tag the engine runs, C(fleet_image); C(moved)), the tag that keeps the
    image it pointed at before as C(<image_repo>:adopted-<12 hex of its id>) when that image is not a recorded
    release (C(adopted)), the release tags to remove to keep the O(keep_releases) releases most recently put into
    service, always the serving one and the one it replaced (C(remove)), and the record after it all (C(record)).
    The role moves and removes the tags with M(community.docker.docker_image_tag) and
    M(community.docker.docker_image_remove). It reports a change only in check mode (the move it would make).
  - O(state=served) writes O(record) (the C(record) result of O(state=serving)) to C(<state_dir>/releases.json) and
    removes O(pruned_archives) from C(<state_dir>/bundles), once the tags moved.
  - O(state=query) reads the releases, the serving tag and the named engine containers (their image and the bundle
    hash read from the manifest inside the running container) and can resolve O(release); it changes nothing.
  - Restarting the engine is not this module's job (playbooks/engine.yml).
version_added: "1.0.0"
author: sparkfleet contributors (!UNKNOWN)
options:
  state:
    description: prepared, tested, serving, served or query.
    type: str
    choices: [prepared, tested, serving, served, query]
    default: query
  image_repo:
    description: Repository of the release tags.
    type: str
    required: true
  serving_image:
    description: The tag the engine runs; O(state=serving) moves it.
    type: str
    required: true
  state_dir:
    description: Where the node keeps releases.json.
    type: path
    default: /var/lib/sparkfleet/adapters
  context:
    description: >-
      The build context (the recipe checkout): required for O(state=prepared); with O(state=query) the result's
      C(context) says whether its Dockerfile and base image are there.
    type: path
  manifest:
    description: The bundle manifest (the C(manifest) result of M(adapter_bundle)) for O(state=prepared).
    type: dict
  archive:
    description: >-
      (prepared) The bundle archive on this node (M(adapter_bundle)'s C(archive), copied here); its files are checked
      against O(manifest) and written into O(context) where they differ.
    type: path
  owner:
    description: (prepared) User that owns the files written into O(context) (its primary group too).
    type: str
  preview:
    description: >-
      (prepared, check mode) Bundle path to text (M(adapter_bundle)'s C(preview)): content for the diff when the archive
      is not on the node yet (a check run does not copy it). Ignored outside check mode.
    type: dict
  dockerfile:
    description: The Dockerfile, relative to O(context).
    type: str
    default: Dockerfile
  base_image:
    description: The base image; empty means the Dockerfile's first FROM.
    type: str
    default: ""
  prepared:
    description: (tested) What O(state=prepared) returned on this node for the bundle.
    type: dict
  image_id:
    description: (tested) The id of the candidate image the test ran (M(community.docker.docker_image)'s C(image.Id)).
    type: str
  test_status:
    description: (tested) The in-image test's exit status (M(community.docker.docker_container)'s C(status)); null when it did not run.
    type: int
  test_output:
    description: (tested) The in-image test's output.
    type: str
    default: ""
  node:
    description: (tested) How a failure names this node, e.g. C(rank 1 (spark2)).
    type: str
    default: this node
  evidence:
    description: (tested) Where the test output is kept (named in a failure).
    type: str
    default: ""
  release:
    description: >-
      The release to serve (O(state=serving)) or resolve (O(state=query)): C(current), C(previous) (the one that
      served before the last deploy), a tag (C(dsv41-3x-spark:bundle-3f9a0c1d2e4b) or C(bundle-3f9a0c1d2e4b)) or a
      bundle hash (12 hex digits or more).
    type: str
    default: ""
  action:
    description: What O(state=serving) records (deploy moves C(previous); rollback and restore do not).
    type: str
    choices: [deploy, rollback, restore]
    default: deploy
  keep_releases:
    description: Releases kept (by last time in service); the serving one and the one it replaced always are.
    type: int
    default: 3
  pending:
    description: >-
      (serving, check mode only) The release's image would be built by this run first (a check run builds
      nothing): report that the serving tag would move to it instead of failing because it does not exist yet.
    type: bool
    default: false
  record:
    description: (served) The release record to write (the C(record) result of O(state=serving)).
    type: dict
  pruned_archives:
    description: (served) Bundle archive names in C(<state_dir>/bundles) to remove (the C(pruned_archives) result of O(state=serving)).
    type: list
    elements: str
    default: []
  containers:
    description:
      - Engine container names O(state=query) reports on; required with O(state=query), V([]) for none (the
        adapters role passes adapters_engine_containers, the inventory's fleet_head_container and fleet_worker_container).
    type: list
    elements: str
  image_manifest:
    description: Where images carry the bundle manifest.
    type: str
    default: /opt/dsv41/sparkfleet-bundle.json
  dockerfile_lines:
    description: (query with O(context)) Lines the Dockerfile must hold; the result's C(context.missing_lines) lists those it lacks.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    description: Reads the context, tags and record, and reports what would be written, removed, recorded, tagged or pruned.
  diff_mode:
    support: full
    description: >-
      O(state=prepared) shows every context file it writes or removes (text content, or size and sha256);
      O(state=serving) shows the serving tag's release and the kept releases before and after.
"""

EXAMPLES = r"""
- name: Write the bundle into the build context and decide whether to build
  adapter_release:
    state: prepared
    context: /home/mia/dsv41-3x-spark
    manifest: "{{ bundle.manifest }}"
    archive: /var/lib/sparkfleet/adapters/bundles/bundle-3f9a0c1d2e4b.tar
    image_repo: dsv41-3x-spark
    serving_image: dsv41-3x-spark:local
  register: prepared

- name: Record the tested release (or fail naming the failing test)
  adapter_release:
    state: tested
    prepared: "{{ prepared }}"
    image_id: "{{ built.image.Id }}"
    test_status: "{{ selftest.status }}"
    test_output: "{{ selftest.container.Output }}"
    node: rank 1 (spark2)
    image_repo: dsv41-3x-spark
    serving_image: dsv41-3x-spark:local

- name: Work out what serving it takes (then community.docker.docker_image_tag moves the tags)
  adapter_release:
    state: serving
    release: "dsv41-3x-spark:bundle-{{ bundle.bundle_short }}"
    image_repo: dsv41-3x-spark
    serving_image: dsv41-3x-spark:local
    keep_releases: 3
  register: serving

- name: Record it once the tags moved
  adapter_release:
    state: served
    record: "{{ serving.record }}"
    pruned_archives: "{{ serving.pruned_archives }}"
    image_repo: dsv41-3x-spark
    serving_image: dsv41-3x-spark:local

- name: Roll back to the release that served before the last deploy
  adapter_release:
    state: serving
    release: previous
    action: rollback
    image_repo: dsv41-3x-spark
    serving_image: dsv41-3x-spark:local
"""

RETURN = r"""
tag:
  description: (prepared, tested) The release tag of the bundle.
  returned: state=prepared or state=tested
  type: str
  sample: dsv41-3x-spark:bundle-3f9a0c1d2e4b
bundle:
  description: The bundle hash of the built or served release (empty for an adopted image).
  returned: state=prepared, state=tested or state=serving
  type: str
  sample: 3f9a0c1d2e4b5a6978877665544332211ffeeddccbbaa99887766554433221100
image_id:
  description: The image id (digest) of the release tag now (prepared), of the tested image, or of the served release.
  returned: state=prepared, state=tested or state=serving
  type: str
  sample: sha256:0d6f...
candidate:
  description: (prepared, tested) The tag the new image is built to (C(<image_repo>:candidate-<12 hex>)).
  returned: state=prepared or state=tested
  type: str
  sample: dsv41-3x-spark:candidate-3f9a0c1d2e4b
candidate_name:
  description: (prepared) The candidate's repository (the O(image_repo)).
  returned: state=prepared
  type: str
candidate_tag:
  description: (prepared) The candidate's tag (C(candidate-<12 hex>)).
  returned: state=prepared
  type: str
base_image:
  description: (prepared) The base image.
  returned: state=prepared
  type: str
  sample: lmsysorg/sglang:dev-dsv41
base_id:
  description: (prepared) The base image's id.
  returned: state=prepared
  type: str
  sample: sha256:77aa...
dockerfile_sha256:
  description: (prepared) The Dockerfile's sha256.
  returned: state=prepared
  type: str
files:
  description: (prepared) Files in the bundle.
  returned: state=prepared
  type: int
build:
  description: (prepared) Whether the image must be built (build_reasons is not empty).
  returned: state=prepared
  type: bool
build_reasons:
  description: (prepared) Why the image must be built; empty when the tagged, tested image is current.
  returned: state=prepared
  type: list
  elements: str
  sample: [no image is tagged dsv41-3x-spark:bundle-3f9a0c1d2e4b]
tested:
  description: (tested) The test passed and the release is recorded.
  returned: state=tested
  type: bool
written:
  description: (prepared) Context files written because they differed (in check mode, to write).
  returned: state=prepared
  type: list
  elements: str
  sample: [adapter/sitecustomize.py, sparkfleet-bundle.json]
removed:
  description: (prepared) Files removed from the directories the bundle owns in the context (in check mode, to remove).
  returned: state=prepared
  type: list
  elements: str
  sample: [adapter/old_adapter.py]
release:
  description: (serving) The release tag the serving tag points at after this run.
  returned: state=serving
  type: str
  sample: dsv41-3x-spark:bundle-3f9a0c1d2e4b
moved:
  description: (serving) Whether the serving tag moves (the engine needs a restart to run it).
  returned: state=serving
  type: bool
previous_release:
  description: (serving) The release the serving tag pointed at before.
  returned: state=serving
  type: str
  sample: dsv41-3x-spark:adopted-0d6f2b7c9e11
previous_image_id:
  description: (serving) The image id the serving tag pointed at before.
  returned: state=serving
  type: str
adopted:
  description: (serving) The tag given to a serving image that was not a recorded release, if any.
  returned: state=serving
  type: str
remove:
  description: (serving) Release tags to remove (beyond keep_releases) that are on this node.
  returned: state=serving
  type: list
  elements: str
record:
  description: (serving) The release record once the release serves (for O(state=served)); null in check mode before a build.
  returned: state=serving
  type: dict
pruned:
  description: (serving) Release tags dropped from the record (beyond keep_releases).
  returned: state=serving
  type: list
  elements: str
pruned_archives:
  description: (serving, served) Bundle archives (to be) removed from C(<state_dir>/bundles) (their release is no longer kept).
  returned: state=serving or state=served
  type: list
  elements: str
releases:
  description: The kept releases, most recently served first.
  returned: state=serving or state=query
  type: list
  elements: dict
  sample: [{tag: dsv41-3x-spark:bundle-3f9a0c1d2e4b, bundle: 3f9a..., image_id: sha256:0d6f..., adopted: false}]
serving_image_id:
  description: (query) The image id the serving tag points at.
  returned: state=query
  type: str
current:
  description: (query) The release the serving tag points at (null when it is not a recorded release).
  returned: state=query
  type: dict
previous:
  description: (query) The release that served before the last deploy.
  returned: state=query
  type: dict
containers:
  description: (query) Each engine container found - name, status, image, image_id, tags, release, tag, bundle (read
    inside the running container), note.
  returned: state=query
  type: list
  elements: dict
  sample: [{name: dsv41-head, status: running, image_id: sha256:0d6f..., tag: dsv41-3x-spark:bundle-3f9a0c1d2e4b,
            bundle: 3f9a...}]
resolved:
  description: (query) The release O(release) names, or null (see resolve_error).
  returned: state=query
  type: dict
context:
  description: >-
    (query with O(context)) path, dockerfile, exists, base_image, base_id (null when the base image is not on the
    node), missing_lines, problems (sentences; empty when a build can start).
  returned: state=query and O(context) is given
  type: dict
  sample: {path: /home/mia/dsv41-3x-spark, exists: true, base_image: lmsysorg/sglang:dev-dsv41, base_id: sha256:77aa...,
           missing_lines: [], problems: []}
resolve_error:
  description: (query) Why O(release) did not resolve.
  returned: state=query and O(release) did not resolve
  type: str
"""

import pwd

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.adapter_bundle import BundleError
from ansible.module_utils.adapter_release import (
    BuildRequest, Docker, ReleaseError, ServeRequest, context_view, prepare, query, record_serving, serve,
    subprocess_runner, tested)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["prepared", "tested", "serving", "served", "query"], default="query"),
            image_repo=dict(type="str", required=True),
            serving_image=dict(type="str", required=True),
            state_dir=dict(type="path", default="/var/lib/sparkfleet/adapters"),
            context=dict(type="path"),
            manifest=dict(type="dict"),
            archive=dict(type="path"),
            owner=dict(type="str"),
            preview=dict(type="dict"),
            dockerfile=dict(type="str", default="Dockerfile"),
            base_image=dict(type="str", default=""),
            prepared=dict(type="dict"),
            image_id=dict(type="str"),
            test_status=dict(type="int"),
            test_output=dict(type="str", default=""),
            node=dict(type="str", default="this node"),
            evidence=dict(type="str", default=""),
            record=dict(type="dict"),
            pruned_archives=dict(type="list", elements="str", default=[]),
            release=dict(type="str", default=""),
            action=dict(type="str", choices=["deploy", "rollback", "restore"], default="deploy"),
            keep_releases=dict(type="int", default=3),
            pending=dict(type="bool", default=False),
            containers=dict(type="list", elements="str"),
            image_manifest=dict(type="str", default="/opt/dsv41/sparkfleet-bundle.json"),
            dockerfile_lines=dict(type="list", elements="str", default=[]),
        ),
        required_if=[("state", "prepared", ("context", "manifest")), ("state", "tested", ("prepared",)),
                     ("state", "serving", ("release",)), ("state", "served", ("record",)),
                     ("state", "query", ("containers",))],
        supports_check_mode=True,
    )
    p = module.params
    docker = Docker(subprocess_runner)
    try:
        if p["state"] == "prepared":
            owner = None
            if p["owner"]:
                try:
                    pw = pwd.getpwnam(p["owner"])
                except KeyError:
                    module.fail_json(msg=f"owner {p['owner']} is not a user on this node")
                owner = (pw.pw_uid, pw.pw_gid)
            result = prepare(BuildRequest(
                context=p["context"], manifest=p["manifest"], image_repo=p["image_repo"], state_dir=p["state_dir"],
                serving_image=p["serving_image"], dockerfile=p["dockerfile"], base_image=p["base_image"],
                archive=p["archive"] or "", owner=owner,
                preview=p["preview"] if module.check_mode else None), docker, module.check_mode)
            if not module._diff:
                result.pop("diff", None)
        elif p["state"] == "tested":
            result = tested(p["state_dir"], p["serving_image"], p["prepared"], p["image_id"], p["test_status"],
                            p["test_output"], p["node"], p["evidence"], module.check_mode)
        elif p["state"] == "serving":
            result = serve(ServeRequest(
                image_repo=p["image_repo"], serving_image=p["serving_image"], state_dir=p["state_dir"],
                release=p["release"], keep_releases=p["keep_releases"], action=p["action"], pending=p["pending"]),
                docker, module.check_mode)
            if not module._diff or not result["changed"]:
                result.pop("diff", None)
            # It changes nothing itself: the role's community.docker tasks move the tags, state=served records.
            # In check mode its changed says whether the serving tag would move (drift.yml's row).
            result["changed"] = bool(result["changed"]) and module.check_mode
        elif p["state"] == "served":
            result = record_serving(p["state_dir"], p["serving_image"], p["record"], p["pruned_archives"],
                                    module.check_mode)
        else:
            result = query(p["image_repo"], p["serving_image"], p["state_dir"], p["containers"], docker,
                           selector=p["release"], manifest_path=p["image_manifest"])
            if p["context"]:
                result["context"] = context_view(p["context"], p["dockerfile"], p["base_image"],
                                                 p["dockerfile_lines"], docker)
            result["changed"] = False
    except (ReleaseError, BundleError) as exc:
        module.fail_json(msg=exc.msg, **exc.extra)
    except OSError as exc:
        module.fail_json(msg=f"adapter release ({p['state']}) failed: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
