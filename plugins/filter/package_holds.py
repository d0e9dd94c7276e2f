# -*- coding: utf-8 -*-
"""Filters of the package_holds role.

    {{ stdout | package_holds_parse }} -> {package: {"version": str, "held": bool}}

Parses `dpkg-query -W -f '${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'`: only installed packages count
(status "ii", or "hi" when held; "rc" leftovers of removed packages do not). Pure Python, unit-tested.
"""
from __future__ import annotations


def package_holds_parse(stdout: str) -> dict:
    out = {}
    for line in (stdout or "").splitlines():
        parts = line.split("\t")
        if len(parts) < 3:
            continue
        name, version, status = parts[0], parts[1], parts[2].strip()
        if len(status) >= 2 and status[1] == "i" and status[0] in "ih":
            out[name] = {"version": version, "held": status[0] == "h"}
    return out


class FilterModule:
    def filters(self):
        return {"package_holds_parse": package_holds_parse}
