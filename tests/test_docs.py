"""The docs' contract.

* Links: every relative link in README.md, docs/**/*.md and the deployables' READMEs points to a file (and
  heading) that exists.
* The README reads in two minutes: at most 100 lines, none over 160 characters, the two commands CI and the
  Makefile name, a picture the project draws (the README names the script that writes it), a link to every
  reference page.
* Code named in the reference pages exists: repository paths (``src/...``, ``tests/...``, ...; ``gateway/...``
  may also be a path in ``src/autellix/``) and dotted modules (``autellix.engine.kv.connector``, an attribute
  after the module). The dated records in docs/results/ are left out: they say what was true on their day.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: The deployables' own READMEs, reference pages like docs/*.md.
COMPONENT_READMES = sorted(ROOT.glob("*/README.md"))
PAGES = sorted([README, *(ROOT / "docs").rglob("*.md"), *COMPONENT_READMES])
#: Pages that say what is true now (not the dated records, which are never edited).
REFERENCE_PAGES = [p for p in PAGES if "results" not in p.relative_to(ROOT).parts]

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


# ---- the README ------------------------------------------------------------------------
README_MAX_LINES = 100
README_MAX_WIDTH = 160
#: The README's two commands: the main job and the tests (the Makefile's targets; CI's .ci/run calls the second).
COMMANDS = {"make up": "up", "make test": "test"}
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)")


def fenced_lines(text: str) -> list[str]:
    """The lines inside fenced code blocks."""
    lines, in_fence = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        elif in_fence:
            lines.append(line)
    return lines


def test_the_readme_reads_in_two_minutes() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md: {len(lines)} lines, at most {README_MAX_LINES}"
    wide = [f"line {n}: {len(line)}" for n, line in enumerate(lines, 1) if len(line) > README_MAX_WIDTH]
    assert not wide, f"README.md lines over {README_MAX_WIDTH} characters: " + "; ".join(wide)


def test_the_readme_has_the_two_commands() -> None:
    commands = [line.split("#")[0].strip() for line in fenced_lines(README.read_text(encoding="utf-8"))]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for command, target in COMMANDS.items():
        assert command in commands, f"README.md: no `{command}` in a code block"
        assert re.search(rf"^{target}:", makefile, re.M), f"Makefile: no target `{target}`"
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_the_readme_shows_a_picture_the_project_draws() -> None:
    text = README.read_text(encoding="utf-8")
    images = [target for line in prose_lines(text) for target in IMAGE.findall(line)]
    assert images, "README.md shows no picture"
    scripts = [ROOT / m for m in re.findall(r"`(?:\.venv/bin/python )?((?:experiments|src)/[\w/.-]+\.py)", text)]
    for image in images:
        path = (ROOT / image).resolve()
        assert path.is_file() and path.parent == ROOT / "docs" / "img", f"{image}: not a file in docs/img/"
        makers = [s for s in scripts if s.is_file() and path.name in s.read_text(encoding="utf-8")]
        assert makers, f"README.md names no script that writes {path.name}"


def test_the_readme_links_every_reference_page() -> None:
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in relative_links(README)}
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"README.md links no {missing}"


# ---- code named in the reference pages -----------------------------------------------------
TOP_LEVEL = ("src", "tests", "experiments", "charts", "crds", "csrc", "images", "gateway", "operator",
             "engine-image", "docs")
_TOP = "|".join(map(re.escape, TOP_LEVEL))
CODE_PATH = re.compile(rf"(?<![\w./-])((?:{_TOP})/[\w./*-]*)")
#: ``autellix.ai`` is the custom resources' API group, not a module.
MODULE = re.compile(r"(?<![\w./-])(autellix(?:_lab)?(?:\.(?!ai\b)\w+)+)")
#: Paths a page names on purpose that are not in the tree, and why.
NOT_IN_TREE = {
    "images/out/": "the smoke run's logs (git-ignored)",
    "src/autellix/backends/sglang.py": "the module an SGLang backend would add (docs/backends.md)",
}


def code_spans(text: str) -> list[str]:
    """Whole lines of fenced blocks and the inline code spans of the rest."""
    spans, in_fence = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        elif in_fence:
            spans.append(line)
        else:
            spans.extend(m.group(0).strip("`") for m in CODE_SPAN.finditer(line))
    return spans


def path_exists(path: str, root: Path = ROOT) -> bool:
    """A repository path, or one under ``src/autellix/`` (``gateway/routes.py``); ``*`` globs."""
    for base in (root, root / "src" / "autellix"):
        if glob.glob(str(base / path)) if "*" in path else (base / path).exists():
            return True
    return False


def module_exists(name: str, root: Path = ROOT) -> bool:
    """``a.b.c``: packages and a module under src/, then at most one attribute the module (or package) names."""
    first, *rest = name.split(".")
    where = root / "src" / first
    if not (where / "__init__.py").is_file():
        return False
    for i, part in enumerate(rest):
        if (where / part / "__init__.py").is_file():
            where = where / part
            continue
        module = where / f"{part}.py"
        if module.is_file():
            attrs, text = rest[i + 1:], module.read_text(encoding="utf-8")
        else:
            attrs, text = rest[i:], (where / "__init__.py").read_text(encoding="utf-8")
        return not attrs or re.search(rf"\b{re.escape(attrs[0])}\b", text) is not None
    return True


def missing_code(page: Path, root: Path = ROOT) -> list[str]:
    missing = []
    for span in code_spans(page.read_text(encoding="utf-8")):
        for path in CODE_PATH.findall(span):
            path = path.rstrip(".,:;")
            if path not in NOT_IN_TREE and not any(c in path for c in "<{") and "..." not in path \
                    and not path_exists(path, root):
                missing.append(path)
        missing += [m for m in MODULE.findall(span) if not module_exists(m.rstrip("."), root)]
    return sorted(set(missing))


def test_missing_code_is_caught(tmp_path: Path) -> None:
    (tmp_path / "src" / "autellix" / "engine" / "kv").mkdir(parents=True)
    for package in ("autellix", "autellix/engine", "autellix/engine/kv"):
        (tmp_path / "src" / package / "__init__.py").write_text('"""x."""\nfrom .y import Exported\n')
    (tmp_path / "src" / "autellix" / "engine" / "kv" / "connector.py").write_text("class AutellixSwapConnector: ...\n")
    page = tmp_path / "page.md"
    page.write_text("`src/autellix/engine/kv/connector.py` `gateway/routes.py` `src/autellix/engine/kv_pool.py`\n"
                    "`autellix.engine.kv.connector.AutellixSwapConnector` `autellix.engine.Exported` `autellix.ai`\n"
                    "`autellix.engine.kv_connector` `autellix.engine.kv.connector.Gone` `src/<name>.py`\n"
                    "```\npython -m autellix.engine.kv_kernel where\n```\n", encoding="utf-8")
    assert missing_code(page, tmp_path) == ["autellix.engine.kv.connector.Gone", "autellix.engine.kv_connector",
                                            "autellix.engine.kv_kernel", "gateway/routes.py",
                                            "src/autellix/engine/kv_pool.py"]


@pytest.mark.parametrize("page", REFERENCE_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_named_in_reference_pages_exists(page: Path) -> None:
    missing = missing_code(page)
    assert not missing, f"{page.relative_to(ROOT)} names what is not in the tree: " + ", ".join(missing)
