"""The project cites only its own documents: every `docs/reference.md section N` names a section that exists
there, and no tracked file points at a document outside the repository (issue 21 item 4)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CITATION = re.compile(r"docs/reference\.md,? sections? (\d+[a-z]?)")
OUTSIDE = re.compile(r"FLEET\.md|\.\./shared/|/work/shared")


def _tracked_text_files():
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        path = REPO / name
        if path.suffix in {".json", ".png", ".safetensors", ".bin"} or not path.is_file():
            continue
        try:
            yield name, path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue


def _sections() -> set[str]:
    text = (REPO / "docs" / "reference.md").read_text(encoding="utf-8")
    return set(re.findall(r"^#{2,3} (\d+[a-z]?)\. ", text, flags=re.M))


def test_every_cited_section_exists():
    sections = _sections()
    assert {"1", "7", "7a", "9", "9a", "10", "11"} <= sections, sections
    missing = [(name, sec) for name, text in _tracked_text_files() for sec in CITATION.findall(text)
               if sec not in sections]
    assert not missing, missing


def test_no_file_cites_a_document_outside_the_repository():
    this = Path(__file__).name
    found = [(name, n + 1) for name, text in _tracked_text_files() if not name.endswith(this)
             for n, line in enumerate(text.splitlines()) if OUTSIDE.search(line)]
    assert not found, found
