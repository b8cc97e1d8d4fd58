"""Bidi and zero-width characters in alert text: escaped visibly in the log and on the status page.

A label value or an override reason comes from whoever reaches Alertmanager's API or holds a token.
Shown raw, a right-to-left override (U+202E) turns ``engine-0\u202e1-enigne`` into what reads as
another engine, and a zero-width space (U+200B) makes two different scopes look the same. The
characters expected escaped are worked out here from Unicode itself (``unicodedata``: category
Cf, format) and from the ranges the review named, not from what the code prints.
"""

from __future__ import annotations

import logging
import sys
import unicodedata

import pytest

from fusebox.fuse.http.status import render_status
from fusebox.fuse.logsafe import EscapeControl, escape_control

# The review's list: bidi embeddings/overrides, isolates, zero-width and marks, the BOM.
NAMED = [*range(0x202A, 0x202F), *range(0x2066, 0x206A), *range(0x200B, 0x2010), 0xFEFF]
# Every format character Python's Unicode database knows (U+00AD, U+061C, U+2060..., tags U+E0001...).
FORMAT = [c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"]


def _escape_of(c: int) -> str:
    """How a character is written escaped: Python's own notation for it."""
    return f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"


def test_the_review_list_is_format_characters_and_each_is_escaped_visibly():
    assert all(unicodedata.category(chr(c)) == "Cf" for c in NAMED)
    for c in NAMED:
        assert escape_control(f"a{chr(c)}b") == f"a{_escape_of(c)}b"


def test_no_format_character_survives_and_other_scripts_do():
    assert len(FORMAT) > 150  # Unicode 15: 170; the loop really covered them
    text = "".join(chr(c) for c in FORMAT)
    out = escape_control(text)
    assert not any(unicodedata.category(ch) == "Cf" for ch in out)
    assert out == "".join(_escape_of(c) if c >= 0x100 else f"\\x{c:02x}" for c in FORMAT)
    # letters, marks and symbols of other scripts are not escaped
    for word in ("modèle", "模型", "نموذج", "モデル", "ü\u0308", "GPU-5f3c"):
        assert escape_control(word) == word


def test_the_log_filter_escapes_a_bidi_override_in_a_label():
    rec = logging.LogRecord("fusebox.fuse", logging.INFO, __file__, 1, "trip %s", ("engine-0\u202e1-enigne\u200b",), None)
    assert EscapeControl().filter(rec)
    assert rec.getMessage() == "trip engine-0\\u202e1-enigne\\u200b"


def _state(labels: dict[str, str], reason: str) -> tuple[dict, list[dict]]:
    level = {"tripped": True, "tripped_at": 100.0, "release_at": None, "action": "freeze_admissions",
             "alerts": ["KVCacheGrowthRateHigh/abc123"], "override": None}
    state = {"scopes": [{"key": "cluster=a,engine=" + labels["engine"], "labels": labels, "level": 1,
                         "levels": {"1": level}}],
             "levels": {"cluster=a,engine=" + labels["engine"]: 1}, "dry_run": True, "pending_actions": 0, "hold_s": 60.0}
    audit = [{"at": 100.0, "kind": "trip", "scope_key": "cluster=a,engine=" + labels["engine"], "level": 1,
              "action": "freeze_admissions", "source": "KVCacheGrowthRateHigh", "reason": reason}]
    return state, audit


@pytest.mark.parametrize("c", NAMED, ids=[f"U+{c:04X}" for c in NAMED])
def test_the_status_page_shows_each_format_character_escaped(c):
    state, audit = _state({"cluster": "a", "engine": f"engine-0{chr(c)}1-enigne"}, f"canary{chr(c)}done")
    page = render_status(state, audit, now=160.0)  # type: ignore[arg-type]
    assert chr(c) not in page
    assert f"engine-0{_escape_of(c)}1-enigne" in page and f"canary{_escape_of(c)}done" in page
