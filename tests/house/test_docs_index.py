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


PAGES = sorted(p.name for p in DOCS.glob("*.md"))
LONG_PAGES = [p for p in PAGES if len((DOCS / p).read_text().splitlines()) > LONG]


def test_some_pages_are_long_enough_to_need_contents():
    """The case below runs on the long pages only: they are there (fuse.md alone is over 1,000 lines)."""
    assert "fuse.md" in LONG_PAGES and len(LONG_PAGES) >= 5, LONG_PAGES


@pytest.mark.parametrize("page", LONG_PAGES)
def test_a_long_page_opens_with_contents_that_match_its_headings(page):
    text = (DOCS / page).read_text()
    assert "\nContents:\n" in text, f"docs/{page} is over {LONG} lines: give it a contents list"
    toc, _, body = text.partition("\nContents:\n")[2].partition("\n## ")
    assert re.findall(r"\]\(#([^)]+)\)", toc) == _headings("## " + body)


@pytest.mark.parametrize("page", PAGES)
def test_a_page_opens_with_its_title_and_its_anchors_lead_to_its_headings(page):
    """Every page, long or short: a `# ` title on line 1, no two `##`/`###` headings with one
    anchor (the second would be unreachable), and each `](#anchor)` link names a heading of the page."""
    text = (DOCS / page).read_text()
    assert re.match(r"# \S", text), f"docs/{page} does not open with a `# ` title"
    headings = _headings(text)
    assert len(headings) == len(set(headings)), f"docs/{page}: two headings share an anchor"
    for anchor in re.findall(r"\]\(#([^)]+)\)", text):
        assert anchor in headings, f"docs/{page} links to #{anchor}, which is no heading of it"


@pytest.mark.parametrize("doc", ["README.md", "docs/README.md", "bench/README.md"])
def test_the_front_pages_link_to_files_that_exist(doc):
    path = ROOT / doc
    for link in LINK.findall(path.read_text()):
        if "://" in link or link.startswith("#"):
            continue
        assert (path.parent / link.split("#")[0]).exists(), f"{doc} links to {link}, which is not there"
