"""The project speaks of itself alone: no file it tracks names a work session or an issue by number."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The word, then a number after spaces or "#", the two perhaps on two lines of a comment or docstring.
LABEL = re.compile(r"\b(?:session|issue)[\s#*/>`'\"-]*?[\s#]+[0-9]+\b", re.IGNORECASE)

BINARY = {".png", ".svg", ".pdf", ".gz", ".so", ".whl", ".jpg"}


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the tracked files are unknown")
    paths = [ROOT / name for name in listed.stdout.decode().split("\0") if name]
    return [p for p in paths if p.is_file() and p.suffix not in BINARY]


def labels(text: str) -> list[str]:
    return [" ".join(m.group(0).split()) for m in LABEL.finditer(text)]


#: Built from parts, so that this file names no past work itself.
SESSION, ISSUE = "sess" + "ion", "iss" + "ue"


@pytest.mark.parametrize("text", [
    f"as {SESSION} 16 measured", f"see {ISSUE.title()} #15", f"behind it ({ISSUE}\n15 measured",
    f"{SESSION.title()} 3-4", f"# the fix from the\n# {SESSION}\n# 12 run",
])
def test_a_label_is_caught(text: str) -> None:
    assert labels(text)


@pytest.mark.parametrize("text", [
    "a session's 16 calls", "the session id", "issues 429 with Retry-After", "sessions 200 and 500", "session_16",
    "x-session-id: 7",
])
def test_ordinary_words_are_not_labels(text: str) -> None:
    assert not labels(text)


def test_no_tracked_file_names_past_work() -> None:
    found = {str(p.relative_to(ROOT)): hits for p in tracked_text_files()
             if (hits := labels(p.read_text(errors="replace")))}
    assert not found, found
