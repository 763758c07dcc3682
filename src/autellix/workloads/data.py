"""Readers for the shared workload data (ShareGPT, BFCL v3 multi-turn, HotpotQA, Mooncake's chat trace).

The data is read in place from the shared folder and never copied into the
project: ``$AUTELLIX_WORKLOADS`` when set, else ``<repo root>/../shared/workloads``.
Everything here is read-only and cached per folder.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "AUTELLIX_WORKLOADS"

#: BFCL API class (as named in ``involved_classes``) -> its file in ``multi_turn_func_doc``.
BFCL_CLASS_FILES: dict[str, str] = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}

#: The four multi-turn categories, in a fixed order (program sampling depends on it).
BFCL_CATEGORIES: tuple[str, ...] = ("base", "long_context", "miss_func", "miss_param")


def workloads_dir(data_dir: Path | str | None = None) -> Path:
    """The workload data folder: ``data_dir``, else ``$AUTELLIX_WORKLOADS``, else ``<repo>/../shared/workloads``."""
    if data_dir is not None:
        path = Path(data_dir)
        origin = "the data_dir argument"
    elif os.environ.get(ENV_VAR):
        path = Path(os.environ[ENV_VAR])
        origin = f"${ENV_VAR}"
    else:
        # src/autellix/workloads/data.py -> parents[3] is the repository root.
        path = Path(__file__).resolve().parents[3].parent / "shared" / "workloads"
        origin = "the default location"
    if not path.is_dir():
        raise FileNotFoundError(
            f"workload data folder {path} (from {origin}) does not exist; set {ENV_VAR} to the folder "
            "that holds sharegpt/, bfcl_v3/ and hotpotqa/"
        )
    return path


def _require(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"workload file {path} is missing; set {ENV_VAR} to a complete workloads folder")
    return path


def _read_json_lines(path: Path) -> list[dict]:
    with _require(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@dataclass(frozen=True)
class ShareGPTConversation:
    """One ShareGPT conversation: the whole history concatenated (roles are not marked)."""

    text: str
    output_length: int


@dataclass(frozen=True)
class BfclFunction:
    name: str
    description: str  # the part after "Tool description: " when present
    doc: str  # the function's JSON line, unchanged
    response_fields: tuple[tuple[str, str], ...]  # (name, JSON type) of the response's properties


@dataclass(frozen=True)
class BfclEntry:
    id: str
    category: str
    turns: tuple[tuple[str, ...], ...]  # per turn, the user messages' contents; () for a miss_func turn
    involved_classes: tuple[str, ...]
    ground_truth: tuple[tuple[str, ...], ...]  # per turn, the expected calls, e.g. "cd(folder='temp')"
    missed_functions: dict[int, tuple[str, ...]]  # turn index -> functions that only become available there


@dataclass(frozen=True)
class HotpotQuestion:
    question: str
    answer: str
    type: str


@functools.lru_cache(maxsize=4)
def load_sharegpt(root: Path) -> tuple[ShareGPTConversation, ...]:
    with _require(root / "sharegpt" / "run.json").open(encoding="utf-8") as f:
        rows = json.load(f)
    return tuple(ShareGPTConversation(r["input"], int(r["output_length"])) for r in rows)


@functools.lru_cache(maxsize=4)
def load_bfcl_functions(root: Path) -> dict[str, tuple[BfclFunction, ...]]:
    """API class -> its functions, in file order."""
    out: dict[str, tuple[BfclFunction, ...]] = {}
    for cls, filename in BFCL_CLASS_FILES.items():
        path = _require(root / "bfcl_v3" / "multi_turn_func_doc" / filename)
        funcs = []
        with path.open(encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                d = json.loads(line)
                desc = d.get("description", "")
                desc = desc.split("Tool description:", 1)[-1].strip()
                props = (d.get("response") or {}).get("properties") or {}
                fields = tuple((k, str(v.get("type", "string"))) for k, v in props.items())
                funcs.append(BfclFunction(d["name"], desc, line.strip(), fields))
        out[cls] = tuple(funcs)
    return out


@functools.lru_cache(maxsize=4)
def load_bfcl(root: Path) -> tuple[BfclEntry, ...]:
    """All multi-turn entries of the four categories with their ground-truth call paths."""
    entries: list[BfclEntry] = []
    for category in BFCL_CATEGORIES:
        name = f"BFCL_v3_multi_turn_{category}.json"
        rows = _read_json_lines(root / "bfcl_v3" / name)
        answers = {a["id"]: a["ground_truth"] for a in _read_json_lines(root / "bfcl_v3" / "possible_answer" / name)}
        for r in rows:
            turns = tuple(tuple(m["content"] for m in turn if m.get("role") == "user") for turn in r["question"])
            missed = {int(k): tuple(v) for k, v in (r.get("missed_function") or {}).items()}
            truth = tuple(tuple(t) for t in answers.get(r["id"], ()))
            entries.append(BfclEntry(r["id"], category, turns, tuple(r["involved_classes"]), truth, missed))
    return tuple(entries)


@functools.lru_cache(maxsize=4)
def load_hotpotqa(root: Path) -> tuple[HotpotQuestion, ...]:
    folder = root / "hotpotqa"
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no HotpotQA JSON under {folder}; set {ENV_VAR} to a complete workloads folder")
    out: list[HotpotQuestion] = []
    for path in files:
        with path.open(encoding="utf-8") as f:
            out.extend(HotpotQuestion(q["question"], str(q["answer"]), q.get("type", "")) for q in json.load(f))
    return tuple(out)


#: Tokens per block of the Mooncake trace's ``hash_ids``.
MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class MooncakeTurn:
    """One request of a Mooncake conversation: the tokens it adds to the history, and its reply's."""

    new_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class MooncakeConversation:
    """Consecutive requests of one chat in the Mooncake trace, each over the whole history before it."""

    turns: tuple[MooncakeTurn, ...]


def mooncake_conversations(rows: list[dict]) -> tuple[MooncakeConversation, ...]:
    """The trace's requests joined into conversations, in the order of their first request.

    A request continues an earlier one when its blocks start with all of that
    request's full blocks (every block of it but the last, which its reply
    completes): the latest such request with the most blocks is its turn
    before. The first block alone does not join requests: every request
    starts with it (a system prompt the whole service shares). A turn's new
    tokens are its input over its turn before's input and reply, at least 1
    (the history was trimmed where it is less).
    """
    by_full_blocks: dict[tuple[int, ...], int] = {}
    conversation_of: list[int] = []
    turns: list[list[MooncakeTurn]] = []
    for i, row in enumerate(rows):
        blocks = tuple(row["hash_ids"])
        before = next((by_full_blocks[blocks[:k]] for k in range(len(blocks), 1, -1)
                       if blocks[:k] in by_full_blocks), None)
        if before is None:
            conversation_of.append(len(turns))
            turns.append([MooncakeTurn(int(row["input_length"]), int(row["output_length"]))])
        else:
            previous = rows[before]
            new = int(row["input_length"]) - int(previous["input_length"]) - int(previous["output_length"])
            conversation_of.append(conversation_of[before])
            turns[conversation_of[before]].append(MooncakeTurn(max(1, new), int(row["output_length"])))
        if len(blocks) > 2:
            by_full_blocks[blocks[:-1]] = i
    return tuple(MooncakeConversation(tuple(t)) for t in turns)


@functools.lru_cache(maxsize=4)
def load_mooncake(root: Path) -> tuple[MooncakeConversation, ...]:
    """The conversations of Mooncake's chat trace (``mooncake_conversations``)."""
    return mooncake_conversations(_read_json_lines(root / "mooncake" / "conversation_trace.jsonl"))


def workloads_available(data_dir: str | Path | None = None) -> bool:
    """Whether the workload data can be found (tests skip without it)."""
    try:
        workloads_dir(data_dir)
    except FileNotFoundError:
        return False
    return True
