# -*- coding: utf-8 -*-
# Copyright: sparkfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serving env files of a rank (roles/engine_env), written in one module run a host (library/env_files.py).

An env file is docker's ``--env-file`` format: one ``KEY=value`` line a key, taken literally (no quotes, no ``$``
expansion), ``#`` lines are comments. ``env_file_text`` is the file's whole text; ``plan_file`` compares it with
what the host has; library/env_files.py writes it with file_io.write_atomic and sets owner, group and mode.
"""
from __future__ import annotations

import os
from typing import Iterable, List, Optional

from ansible.module_utils.env_text import key_problem, parse_env_file, secret_values, value_problem
from ansible.module_utils.file_io import regular_stat

FORMAT_LINE = "# docker --env-file format: one KEY=value per line, taken literally (no quotes, no $ expansion); " \
              "not a shell file."


class EnvFileError(Exception):
    """A file that cannot be planned or written (bad key or value, not a regular file, no parent folder)."""


def env_file_text(header: str, what: str, env: dict) -> str:
    """The file's text: the header comment (Ansible's managed string as comment lines), what the file holds, the
    format line, then ``KEY=value`` lines sorted by key. Keys and values are checked: a value with a line break
    would become a second line (a key nobody declared), so it is refused."""
    lines: List[str] = []
    for line in str(header or "").splitlines():
        lines.append(line if line.startswith("#") else "# " + line)
    if what:
        lines.append(f"# {' '.join(str(what).split())}.")
    lines.append(FORMAT_LINE)
    for key in sorted(env, key=lambda k: (str(k).lower(), str(k))):  # Jinja's dictsort order (case-insensitive)
        problem = key_problem("env file key", key) or value_problem(f"env file key {key}", env[key])
        if problem:
            raise EnvFileError(problem)
        lines.append(f"{key}={env[key]}")
    return "\n".join(lines) + "\n"


def read_current(path: str) -> Optional[str]:
    """What the host's file holds (None when absent). A path that is not a regular file is an error: it is never
    replaced silently."""
    try:
        if regular_stat(path) is None:
            return None
    except IsADirectoryError as exc:
        raise EnvFileError(str(exc)) from None
    with open(path, "rb") as fh:
        return fh.read().decode("utf-8", errors="replace")


def plan_file(path: str, text: str) -> dict:
    """{path, before, after, content_changed}: before is None when the file is absent."""
    if not os.path.isabs(path):
        raise EnvFileError(f"{path}: an env file path must be absolute")
    if not os.path.isdir(os.path.dirname(path)):
        raise EnvFileError(f"{path}: its folder does not exist")
    before = read_current(path)
    return {"path": path, "before": before, "after": text, "content_changed": before != text}


def secrets_of(texts: Iterable[Optional[str]], envs: Iterable[dict], extra: Iterable = ()) -> list:
    """Every secret value the desired envs and the files' current texts hold (a rotated key is masked too)."""
    out: list = []
    for env in envs:
        out += secret_values(env or {}, extra)
    for text in texts:
        if text:
            out += secret_values(parse_env_file(text), extra)
    return out
