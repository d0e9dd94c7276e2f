#!/usr/bin/env bash
# ansible-test's validate-modules on the project's modules (called by `make lint`). ansible-test works on a
# collection, so this assembles a throwaway one from library/, module_utils/ and plugins/doc_fragments/ in a
# temporary folder: imports of the project's module_utils, doc fragment names, M() and seealso references get the
# collection's prefix there, and meta/runtime.yml carries the deprecated aliases. The tree itself is not changed.
# Needs voluptuous and antsibull-docs-parser beside ansible-core (ansible-test's own requirements for this test).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[[ "$PY" == */* && "$PY" != /* ]] && PY="$PWD/$PY"   # the script changes directory below
if ! "$PY" -c 'import voluptuous, antsibull_docs_parser' 2>/dev/null; then
  echo "validate-modules needs voluptuous and antsibull-docs-parser in $PY's environment (ansible-test's requirements" \
       "for it: ansible_test/_data/requirements/sanity.validate-modules.txt); install them with requirements.txt." >&2
  exit 1
fi
NS=sparkfleet
NAME=fleet
WORK="$(mktemp -d /tmp/sparkfleet-validate-modules.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
COLL="$WORK/ansible_collections/$NS/$NAME"
mkdir -p "$COLL/plugins/modules" "$COLL/plugins/module_utils" "$COLL/plugins/doc_fragments" "$COLL/meta"

"$PY" - "$ROOT" "$COLL" "$NS.$NAME" <<'PY'
"""Copy the modules, their module_utils and the doc fragments into the collection, with the collection's names."""
import re
import sys
from pathlib import Path

import yaml

root, coll, fqcn = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
utils = sorted(p.stem for p in (root / "module_utils").glob("*.py"))
modules = sorted(p.stem for p in (root / "library").glob("*.py"))
fragments = sorted(p.stem for p in (root / "plugins" / "doc_fragments").glob("*.py"))
util_import = re.compile(r"\bansible\.module_utils\.(%s)\b" % "|".join(map(re.escape, utils)))
module_ref = re.compile(r"\bM\((%s)\)" % "|".join(map(re.escape, modules)))
seealso_ref = re.compile(r"^(\s*- module: )(%s)\s*$" % "|".join(map(re.escape, modules)), re.M)
fragment_ref = re.compile(r"^(\s*- )(%s)\s*$" % "|".join(map(re.escape, fragments)), re.M)


util_from = re.compile(r"^(\s*)from ansible\.module_utils import (%s)\b" % "|".join(map(re.escape, utils)), re.M)


def collection_text(text: str) -> str:
    text = util_from.sub(lambda m: f"{m.group(1)}from ansible_collections.{fqcn}.plugins.module_utils import {m.group(2)}",
                         text)
    text = util_import.sub(lambda m: f"ansible_collections.{fqcn}.plugins.module_utils.{m.group(1)}", text)
    text = module_ref.sub(lambda m: f"M({fqcn}.{m.group(1)})", text)
    text = seealso_ref.sub(lambda m: f"{m.group(1)}{fqcn}.{m.group(2)}", text)
    return fragment_ref.sub(lambda m: f"{m.group(1)}{fqcn}.{m.group(2)}", text)


deprecated = {}
for name in modules:
    text = (root / "library" / f"{name}.py").read_text()
    (coll / "plugins" / "modules" / f"{name}.py").write_text(collection_text(text))
    doc = yaml.safe_load(re.search(r'DOCUMENTATION = r"""(.*?)"""', text, re.S).group(1))
    if doc.get("deprecated"):
        deprecated[name] = {"deprecation": {"removal_version": doc["deprecated"]["removed_in"],
                                            "warning_text": doc["deprecated"]["alternative"]}}
for name in utils:
    text = (root / "module_utils" / f"{name}.py").read_text()
    (coll / "plugins" / "module_utils" / f"{name}.py").write_text(collection_text(text))
for name in fragments:
    text = (root / "plugins" / "doc_fragments" / f"{name}.py").read_text()
    (coll / "plugins" / "doc_fragments" / f"{name}.py").write_text(collection_text(text))
ns, name = fqcn.split(".")
(coll / "galaxy.yml").write_text(yaml.safe_dump({
    "namespace": ns, "name": name, "version": "1.0.0", "readme": "README.md", "authors": ["sparkfleet"]}))
(coll / "README.md").write_text("Throwaway collection for validate-modules.\n")
(coll / "meta" / "runtime.yml").write_text(yaml.safe_dump({
    "requires_ansible": ">=2.16", "plugin_routing": {"modules": deprecated}}))
PY

# `ansible-test sanity --test validate-modules` would first bootstrap pip into a fresh venv from a host outside the
# package registries; this runs the same validator that ansible-core ships with ansible-test, the way ansible-test does.
VALIDATOR="$("$PY" -c 'import ansible_test, os; print(os.path.join(os.path.dirname(ansible_test.__file__), "_util", "controller", "sanity", "validate-modules"))')"
cd "$COLL"
set +e
printf "[defaults]\n" > "$WORK/ansible.cfg"
ANSIBLE_LIBRARY=/dev/null ANSIBLE_CONFIG="$WORK/ansible.cfg" ANSIBLE_COLLECTIONS_PATH="$WORK" PYTHONPATH="$WORK${PYTHONPATH:+:$PYTHONPATH}" \
  "$PY" "$VALIDATOR/validate.py" --format json --arg-spec --collection "ansible_collections/$NS/$NAME" \
  --collection-version 1.0.0 plugins/modules/*.py > "$WORK/report.json"
ls plugins/modules/*.py | wc -l | xargs printf "validate-modules: %s modules checked\n"
status=$?
set -e
"$PY" - "$WORK/report.json" "$status" <<'PY'
"""Print every error as path:line:column: code: message (paths as in the project), then the count."""
import json
import sys

status = int(sys.argv[2])
try:
    report = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit(f"validate-modules did not report (exit status {status}); see its output above")
warnings = [(path.replace("plugins/modules/", "library/"), w) for path, result in sorted(report.items())
            for w in result.get("warnings", [])]
for path, w in warnings:
    print(f"{path}: warning: {w['code']}: {w['msg']}")
warnings = len(warnings)
errors = [(path.replace("plugins/modules/", "library/"), e) for path, result in sorted(report.items())
          for e in result.get("errors", [])]
for path, e in errors:
    print(f"{path}:{e.get('line', 0)}:{e.get('column', 0)}: {e['code']}: {e['msg']}")
print(f"validate-modules: {len(errors)} errors, {warnings} warnings in {len(report)} modules with messages")
sys.exit(1 if errors or status not in (0, 3) else 0)
PY
