# -*- coding: utf-8 -*-
"""Line hygiene for SGLang / DSV41 logs: text check, ANSI codes, prefixes (docs/reference.md section 7a).

Prefixes stripped, in any combination: docker's ``2026-11-29T10:01:02.123456789Z``, SGLang's
``[2026-11-29 10:01:02 TP0 EP0]`` (a scheduler of rank r) and ``[2026-11-29 10:01:02]`` (the main process),
``(rank=1)`` and compose's ``name | ``; a tqdm progress-bar fragment before an SGLang prefix is dropped.
Part of ``sglang_log`` (which re-exports these names); standard library only."""
from __future__ import annotations

import re

MAX_NUL_FRACTION = 0.01


class LogNotText(ValueError):
    """The input is not a text log (compressed, binary, NUL bytes)."""


_BINARY_MAGIC = (
    (b"\x1f\x8b", "gzip-compressed (zcat it first)"),
    (b"\x7fELF", "an ELF executable"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed (zstdcat it first)"),
    (b"\xfd7zXZ\x00", "xz-compressed (xzcat it first)"),
    (b"PK\x03\x04", "a zip archive"),
    (b"BZh", None),  # only with the bzip2 block magic, checked below
)

_ANSI_B = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
_PREFIX_ITEM = re.compile(
    r"[ \t]*(?:"
    r"(?P<docker>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)"
    r"|\[(?P<br>\d{4}-\d\d-\d\d[^\]]{0,80}|(?:TP|rank)\s*=?\s*\d+[^\]]{0,40})\]"
    r"|\((?:rank|tp)\s*[=: ]\s*(?P<pr>\d+)\)"
    r"|(?P<svc>[A-Za-z][\w.-]{0,63})\s+\|(?= )"
    r")[ \t]?"
)
_BR_RANK = re.compile(r"\bTP\s*(\d+)|\brank\s*=?\s*(\d+)")
# An SGLang prefix anywhere in a line: a progress-bar fragment (tqdm, ``ESC[A``) can precede it.
_SGL_PREFIX_ANY = re.compile(r"\[\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[^\]]{0,60}\]")
_BR_EP = re.compile(r"\bEP\s*(\d+)")
_RANK_TAG_B = re.compile(rb"\[[^\]]*?\bTP\s*(\d+)[^\]]*\]|\((?:rank|tp)\s*[=: ]\s*(\d+)\)")


def split_prefix(text: str) -> tuple:
    """Return ``(rank or None, message)``: strip docker/SGLang/rank/compose prefixes, keep the rank."""
    rank, _, msg = split_prefix_ep(text)
    return rank, msg


def split_prefix_ep(text: str) -> tuple:
    """``(rank, ep, message)``; a progress-bar fragment before an SGLang ``[date time ...]`` prefix is dropped."""
    rank = ep = None
    pos = 0
    n = len(text)
    bracket = False
    while pos < n:
        m = _PREFIX_ITEM.match(text, pos)
        if not m or m.end() == pos:
            if not bracket:
                # tqdm redraws its bar with CR and ESC[A, then the next log line follows on the same line
                b = _SGL_PREFIX_ANY.search(text, pos)
                if b is not None and b.start() > pos:
                    pos = b.start()
                    continue
            break
        br = m.group("br")
        if br is not None:
            bracket = True
            r = _BR_RANK.search(br)
            if r:
                rank = int(r.group(1) or r.group(2))
            e = _BR_EP.search(br)
            if e:
                ep = int(e.group(1))
        elif m.group("pr") is not None:
            rank = int(m.group("pr"))
        elif m.group("svc") is not None and pos != 0:
            break  # a "name |" prefix only counts at the very start of the line
        pos = m.end()
    return rank, ep, text[pos:]


def check_text(head: bytes, where: str = "the log") -> None:
    """Raise ``LogNotText`` when ``head`` (the first 64 KiB) is not a text log."""
    for magic, what in _BINARY_MAGIC:
        if head.startswith(magic):
            if what is None:
                if head[4:10] != b"1AY&SY":
                    continue
                what = "bzip2-compressed (bzcat it first)"
            raise LogNotText(f"{where} is not a text log: it is {what}.")
    if head:
        nul = head.count(b"\x00")
        if nul > MAX_NUL_FRACTION * len(head):
            raise LogNotText(
                f"{where} is not a text log: {nul} NUL bytes in its first {len(head)} bytes "
                f"({100.0 * nul / len(head):.1f}% > {100 * MAX_NUL_FRACTION:.0f}%)."
            )
