"""The way into the docs stays true: docs/README.md lists every page of docs/, each long page opens
with a contents list that matches its headings, and the README's links to files lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LONG = 300  # lines: a page this long opens with "Contents:"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings(text: str) -> list[str]:
    """The `##` and `###` headings outside code fences, as anchors, in order."""
    out, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"^#{2,3} (.+)$", line)):
            out.append(_slug(m.group(1)))
    return out


def test_the_docs_index_links_every_page_of_docs_and_only_pages_that_exist():
    links = set(LINK.findall((DOCS / "README.md").read_text()))
    pages = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert {link for link in links if "/" not in link} == pages
    for link in links:
        assert (DOCS / link).resolve().exists(), link


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_a_long_page_opens_with_contents_that_match_its_headings(page):
    text = (DOCS / page).read_text()
    if len(text.splitlines()) <= LONG:
        return
    assert "\nContents:\n" in text, f"docs/{page} is over {LONG} lines: give it a contents list"
    toc, _, body = text.partition("\nContents:\n")[2].partition("\n## ")
    assert re.findall(r"\]\(#([^)]+)\)", toc) == _headings("## " + body)


@pytest.mark.parametrize("doc", ["README.md", "docs/README.md", "bench/README.md"])
def test_the_front_pages_link_to_files_that_exist(doc):
    path = ROOT / doc
    for link in LINK.findall(path.read_text()):
        if "://" in link or link.startswith("#"):
            continue
        assert (path.parent / link.split("#")[0]).exists(), f"{doc} links to {link}, which is not there"
