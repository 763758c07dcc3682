"""Docs links: every relative link in README.md and docs/**/*.md points to a file (and heading) that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

#: ``[text](target)`` and ``![alt](target)``; the target ends at the first space or ``)``.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
EXTERNAL = ("http://", "https://", "mailto:")


def prose_lines(text: str, *, code_spans: bool = False) -> list[str]:
    """The page's lines outside fenced code blocks, inline code spans removed unless ``code_spans``."""
    lines, in_fence = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append(line if code_spans else CODE_SPAN.sub("", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = CODE_SPAN.sub(lambda m: m.group(0).strip("`"), heading).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for line in prose_lines(page.read_text(encoding="utf-8"), code_spans=True):
        match = HEADING.match(line)
        if match:
            base, n = slug(match.group(1)), 0
            while (base if n == 0 else f"{base}-{n}") in found:
                n += 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def relative_links(page: Path) -> list[str]:
    return [target for line in prose_lines(page.read_text(encoding="utf-8"))
            for target in LINK.findall(line) if not target.startswith(EXTERNAL)]


def broken_links(page: Path) -> list[str]:
    """The page's relative links whose file, or heading in a Markdown file, does not exist."""
    broken = []
    for target in relative_links(page):
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no such heading")
    return broken


def test_the_pages_are_found() -> None:
    assert ROOT / "README.md" in PAGES
    assert ROOT / "docs" / "results" / "README.md" in PAGES


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# A `code` heading: here\n## Twice\n## Twice\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](#title) [no file](nowhere.md) `[code](skipped.md)`\n"
                    "[ok](other.md#a-code-heading-here) [ok](other.md#twice-1) [no heading](other.md#thrice)\n"
                    "```\n[fenced](fenced.md)\n```\n", encoding="utf-8")
    assert relative_links(page) == ["#title", "nowhere.md", "other.md#a-code-heading-here", "other.md#twice-1",
                                    "other.md#thrice"]
    assert broken_links(page) == ["nowhere.md: no such file", "other.md#thrice: no such heading"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
