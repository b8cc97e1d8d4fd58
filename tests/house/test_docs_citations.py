"""The reasons the code cites are in the repository: every "docs/pitfalls.md Pn" names an entry of
docs/pitfalls.md, every "docs/metrics.md section N" a section of docs/metrics.md, and nothing cites
the old PITFALLS.md / METRICS.md, which live outside the repository.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PITFALLS = ROOT / "docs" / "pitfalls.md"
METRICS = ROOT / "docs" / "metrics.md"
SUFFIXES = {".py", ".md", ".yml", ".yaml", ".sh", ".toml", ".cfg", ".txt"}
SKIP_DIRS = {"fixtures", "node_modules", "__pycache__", "build", "dist"}

# "docs/pitfalls.md P6", "docs/pitfalls.md P6, P7", "docs/pitfalls.md P6/P7"
_AFTER = re.compile(r"pitfalls\.md (P\d+(?:(?:, ?|/)P\d+)*)")
# "the P6 GPU of docs/pitfalls.md", "the P5 config of docs/pitfalls.md"
_BEFORE = re.compile(r"\b(P\d+)\b[\w ]{0,20}? of docs/pitfalls\.md")
# "docs/metrics.md section 5", "docs/metrics.md sections 1 and 2"
_METRICS = re.compile(r"metrics\.md sections? (\d+(?:(?:, | and )\d+)*)")
_STALE = re.compile(r"PITFALLS (P\d|\.md)|PITFALLS\.md|METRICS\.md")
# a style guide and an issue tracker that are not part of the repository ("STYLE.md section 8",
# "STYLE 6", "(issue 14)"); an upstream project's issue is cited with its number sign ("vLLM issue #25377")
_OUTSIDE = re.compile(r"\bSTYLE(\.md| \d)|\b[Ii]ssue \d")
PRODUCT = ("fusebox", "generator", "collectors", "fuse", "docs", "README.md", "Makefile")


def pitfall_citations(text: str) -> set[str]:
    out = set()
    for m in _AFTER.finditer(text):
        out.update(re.findall(r"P\d+", m.group(1)))
    out.update(m.group(1) for m in _BEFORE.finditer(text))
    return out


def metrics_citations(text: str) -> set[int]:
    return {int(n) for m in _METRICS.finditer(text) for n in re.findall(r"\d+", m.group(1))}


def _sources():
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS]
        for name in filenames:
            path = Path(dirpath) / name
            if path.suffix in SUFFIXES and path != Path(__file__).resolve():
                yield path, path.read_text(errors="replace")


SOURCES = dict(_sources())


def _entries() -> set[str]:
    return set(re.findall(r"^## (P\d+)\. ", PITFALLS.read_text(), re.M))


def test_pitfalls_keeps_the_numbering_of_the_cited_entries():
    assert _entries() == {f"P{i}" for i in range(1, 9)} | {"P23"}
    text = PITFALLS.read_text()
    assert "## P3. `rate()` on a gauge invents growth" in text
    assert "## P8. grafanalib's JSON is not what current Grafana expects" in text
    assert "## P23. smg sheds on its own, and its control plane is open by default" in text


def test_every_cited_pitfall_is_in_docs_pitfalls():
    cited = {}
    for path, text in SOURCES.items():
        for p in pitfall_citations(text):
            cited.setdefault(p, []).append(str(path.relative_to(ROOT)))
    assert len(cited) >= 8, cited  # P1-P8 are cited today: the scan finds them
    missing = {p: where for p, where in cited.items() if p not in _entries()}
    assert missing == {}


def test_every_cited_metrics_section_is_in_docs_metrics():
    sections = {int(n) for n in re.findall(r"^## (\d+) ", METRICS.read_text(), re.M)}
    assert sections == {1, 2, 3, 4, 5, 6, 7, 8}
    cited = set()
    for text in SOURCES.values():
        cited |= metrics_citations(text)
    assert cited >= {1, 2, 5, 6, 7, 8}
    assert cited <= sections


def test_nothing_cites_the_files_outside_the_repository():
    stale = [f"{path.relative_to(ROOT)}:{i}" for path, text in SOURCES.items()
             for i, line in enumerate(text.splitlines(), 1) if _STALE.search(line)]
    assert stale == []


def test_the_product_and_its_docs_cite_no_style_guide_or_issue_from_outside_the_repository():
    """What a comment or a doc gives as its reason is in the repository: the reason itself, not a
    pointer to a tracker or a style guide a reader of the repository cannot open."""
    assert _OUTSIDE.search("Rules (issue 5, STYLE.md section 8):") and _OUTSIDE.search("its cost (STYLE 6)")
    assert not _OUTSIDE.search("(vLLM issue #25377)")
    found = [f"{path.relative_to(ROOT)}:{i}: {line.strip()}" for path, text in SOURCES.items()
             if path.relative_to(ROOT).parts[0] in PRODUCT
             for i, line in enumerate(text.splitlines(), 1) if _OUTSIDE.search(line)]
    assert found == []


def test_the_scanner_reads_every_citation_form():
    doc = "docs/" + "pitfalls.md"
    assert pitfall_citations(f"(see {doc} P6, P7) and {doc} P2/P13; the P5 config of {doc}.") == {
        "P2", "P5", "P6", "P7", "P13"}
    assert metrics_citations("docs/" + "metrics.md sections 1 and 2; docs/" + "metrics.md section 5") == {1, 2, 5}
    assert "P13" not in _entries()
