# -*- coding: utf-8 -*-
# Copyright: (c) sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Deprecated module names (issue 25 items 3 and 9): a read-only module is called ``*_info``; its old name stays
one release as an alias that runs the same code and warns. The one table of aliases and the one warning."""
from __future__ import annotations

# old name: (new name, the release that removes the old one)
DEPRECATED_ALIASES = {
    "boot_log_facts": ("boot_log_info", "2.0.0"),
    "engine_liveness": ("engine_liveness_info", "2.0.0"),
    "engram_status": ("engram_status_info", "2.0.0"),
    "experiment_load": ("experiment_load_info", "2.0.0"),
    "fleet_snapshot": ("fleet_snapshot_info", "2.0.0"),
    "node_preflight": ("node_preflight_info", "2.0.0"),
}
# Where the new name differs from the old one: this ends the warning instead of "the options and results are the same".
NOT_THE_SAME = {
    "node_preflight": "the options and results are the same except fact_name and fact_labels: register the result "
                      "and build the fact with the preflight_node_result filter",
}


def warn_if_deprecated(module, name: str) -> None:
    """Warn through module.deprecate when ``name`` is a deprecated alias; nothing otherwise."""
    if name in DEPRECATED_ALIASES:
        new, version = DEPRECATED_ALIASES[name]
        same = NOT_THE_SAME.get(name, "the options and results are the same")
        module.deprecate(f"{name} is now called {new} (a read-only module returns no ansible_facts); "
                         f"replace the module name, {same}.", version=version)
