"""BFCL v3 multi-turn: a ReAct tool loop, one call per step, simulated tool results.

The plan of a program (:class:`ReactTurn` of :class:`ToolStep`) and the loop
that runs it (:func:`react_program`) serve ``tool_pause`` as well, which plans
its programs over the same entries with other lengths and pauses."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from autellix.workloads.base import (
    LLM,
    MAIN_THREAD,
    AgentProgram,
    Message,
    assistant_message,
    clip_head,
    draw,
    fit_messages,
    nbytes,
    program_rng,
    system_message,
    user_message,
)
from autellix.workloads.data import (
    BfclEntry,
    BfclFunction,
    load_bfcl,
    load_bfcl_functions,
)

BFCL_INSTRUCTIONS = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. "
    "Make one function call per step, written as func_name(param=value, ...); you will see its result. "
    "When the request is fulfilled, reply to the user without a call. The functions:\n"
)
#: "paper": bytes of the system prompt (instructions plus the most relevant tool
#: summaries), so that calls average the paper's 735 prefill tokens.
BFCL_SYSTEM_PAPER = 355
#: "raw": the full JSON tool docs are cut to this many bytes (8 classes' docs are
#: 20-33 KB per program, far over the 8k context); the rest leaves room for history.
BFCL_SYSTEM_RAW = 5200
#: Output tokens per call: paper mean 34.14.
BFCL_DECODE = (34.14, 1, 256, 0.6)
#: Probability that a tool call fails and is retried (the model repeats the step).
#: Per program, the chance that a tool call fails and is retried. Most programs
#: rarely retry (0-10%); one in ten struggles (50-85%). That gives the paper's
#: long tail of calls per program (max 70), which the ground-truth paths alone
#: (max about 24) lack, at a mean still near the paper's 10.75.
BFCL_STRUGGLING = 0.1
BFCL_MAX_CALLS = 70  # the paper's longest program
BFCL_RETRY = ((0.0, 0.1), (0.5, 0.85))  # (usual, struggling) ranges
BFCL_MAX_STEPS = 20
BFCL_TOOL_DELAY = (0.05, 0.5)
#: "raw": bytes of the long tool outputs of the long_context category.
BFCL_LONG_RESULT = 1500


@dataclass(frozen=True)
class ToolStep:
    """One LLM call that asks for a tool, the pause while it runs, and what it returns."""

    max_tokens: int
    pause_s: float
    #: The user message that follows the call ("Observation: " and the tool's result).
    observation: str


@dataclass(frozen=True)
class ReactTurn:
    """A user request: its text, the tool steps it takes, and the reply that ends it."""

    text: str
    steps: tuple[ToolStep, ...]
    reply_tokens: int


def call_name(call: str) -> str:
    return call.split("(", 1)[0].strip()


def entry_functions(entry: BfclEntry, functions: dict[str, tuple[BfclFunction, ...]]) -> list[BfclFunction]:
    """The functions of ``entry``'s API classes, in its class order."""
    return [f for cls in entry.involved_classes for f in functions.get(cls, ())]


def entry_turns(entry: BfclEntry, by_name: dict[str, BfclFunction],
                calibration: str) -> Iterator[tuple[str, Sequence[str]]]:
    """Each turn of ``entry``: what the user says (in ``miss_func``, the held-out functions that
    become available, as docs under "raw" and as name and description otherwise) and its ground-truth calls."""
    for t, user_messages in enumerate(entry.turns):
        if user_messages:
            text = "\n".join(user_messages)
        else:  # miss_func: the held-out functions become available at this turn
            added = [by_name[n] for n in entry.missed_functions.get(t, ()) if n in by_name]
            docs = [f.doc if calibration == "raw" else f"{f.name}: {f.description}" for f in added]
            text = "More functions are available now:\n" + "\n".join(docs)
        yield text, entry.ground_truth[t] if t < len(entry.ground_truth) else ()


def react_program(workload: str, program_id: str, system: str, plan: Sequence[ReactTurn], *,
                  per_turn: bool = False) -> AgentProgram:
    """The ReAct loop over ``plan``: per turn, the user's text, then each tool step (a call, its
    pause, its observation), then the reply; the history is compacted only at the context limit.
    ``per_turn``: each turn starts again from the system prompt (a fresh episode over the same docs)."""

    async def run(llm: LLM) -> None:
        sys_msg = system_message(system)
        history: list[Message] = [sys_msg]
        for turn in plan:
            if per_turn:
                history = [sys_msg]
            history.append(user_message(turn.text))
            for step in turn.steps:
                history = fit_messages(history, step.max_tokens)
                call = await llm.chat(list(history), max_tokens=step.max_tokens, thread=MAIN_THREAD)
                await llm.tool(step.pause_s)
                history += [assistant_message(call), user_message(step.observation)]
            history = fit_messages(history, turn.reply_tokens)
            reply = await llm.chat(list(history), max_tokens=turn.reply_tokens, thread=MAIN_THREAD)
            history.append(assistant_message(reply))

    return AgentProgram(workload, program_id, run, expected_calls=sum(len(t.steps) + 1 for t in plan),
                        expected_tokens=sum(sum(s.max_tokens for s in t.steps) + t.reply_tokens for t in plan))


def _bfcl_system(entry: BfclEntry, funcs: Sequence[BfclFunction], calibration: str) -> str:
    used = {call_name(c) for turn in entry.ground_truth for c in turn}
    ordered = [f for f in funcs if f.name in used] + [f for f in funcs if f.name not in used]
    if calibration == "raw":
        lines, budget = [f.doc for f in ordered], BFCL_SYSTEM_RAW
    else:
        lines, budget = [f"{f.name}: {f.description}" for f in ordered], BFCL_SYSTEM_PAPER
    text = BFCL_INSTRUCTIONS
    for line in lines:
        if nbytes(text) + nbytes(line) + 1 > budget:
            break
        text += line + "\n"
    return clip_head(text, budget)


def _fake_value(rng: random.Random, kind: str) -> object:
    if kind in ("integer", "int"):
        return rng.randrange(1000)
    if kind in ("float", "number"):
        return round(rng.uniform(0, 1000), 2)
    if kind in ("boolean", "bool"):
        return rng.random() < 0.8
    if kind in ("array", "list"):
        return [f"item_{rng.randrange(100)}" for _ in range(rng.randint(1, 4))]
    if kind in ("dict", "object"):
        return {"status": "ok"}
    return f"value_{rng.randrange(10_000)}"


def tool_result(rng: random.Random, func: BfclFunction | None, ok: bool, category: str, calibration: str) -> str:
    if not ok:
        return json.dumps({"error": "Invalid arguments; check the parameters and try again."})
    fields = func.response_fields if func else ()
    if calibration == "paper":
        name, kind = fields[0] if fields else ("result", "string")
        value = _fake_value(rng, kind)
        return json.dumps({name: value if not isinstance(value, list | dict) else "ok"})
    result: dict[str, object] = {name: _fake_value(rng, kind) for name, kind in fields} or {"result": "ok"}
    if category == "long_context":
        result["details"] = clip_head(" ".join(f"entry_{rng.randrange(10**6)}" for _ in range(200)), BFCL_LONG_RESULT)
    return json.dumps(result)


def bfcl_program(
    program_id: str,
    rng: random.Random,
    entries: Sequence[BfclEntry],
    functions: dict[str, tuple[BfclFunction, ...]],
    calibration: str,
) -> AgentProgram:
    entry = entries[rng.randrange(len(entries))]
    missed = {name for names in entry.missed_functions.values() for name in names}
    funcs = entry_functions(entry, functions)
    by_name = {f.name: f for f in funcs}
    system = _bfcl_system(entry, [f for f in funcs if f.name not in missed], calibration)
    retry = rng.uniform(*BFCL_RETRY[rng.random() < BFCL_STRUGGLING])
    made = 0  # calls planned so far
    turns: list[ReactTurn] = []
    for text, truth in entry_turns(entry, by_name, calibration):
        steps: list[ToolStep] = []
        for call in truth:
            ok = False
            while not ok and len(steps) < BFCL_MAX_STEPS and made + len(steps) + 1 < BFCL_MAX_CALLS:
                ok = rng.random() >= retry
                tokens = min(max(1, nbytes(call)), 256) if calibration == "raw" else draw(rng, *BFCL_DECODE)
                delay = round(rng.uniform(*BFCL_TOOL_DELAY), 3)
                result = tool_result(rng, by_name.get(call_name(call)), ok, entry.category, calibration)
                steps.append(ToolStep(tokens, delay, "Observation: " + result))
        turns.append(ReactTurn(text, tuple(steps), draw(rng, *BFCL_DECODE)))
        made += len(steps) + 1
    # "paper": each request is a fresh ReAct episode over the same tool docs
    return react_program("bfcl", program_id, system, tuple(turns), per_turn=calibration == "paper")


def build(indices: Sequence[int], seed: int, calibration: str, root: Path) -> list[AgentProgram]:
    entries, functions = load_bfcl(root), load_bfcl_functions(root)
    return [bfcl_program(f"bfcl-{seed}-{i}", program_rng(seed, "bfcl", i)[1], entries, functions, calibration)
            for i in indices]
