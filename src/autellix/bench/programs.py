"""Agent programs for the program-level serving benchmark (Autellix paper, section 6).

A program is an async function that drives an :class:`LLM` (implemented by the
benchmark runner): a ShareGPT multi-turn chat, a BFCL v3 ReAct tool loop, or a
LATS tree search over a HotpotQA question. ``make_programs`` builds them from the
shared workload data with every random choice seeded per program, so the same
seed gives the same programs and, against a deterministic LLM, the same calls.

The engine under test emits random tokens with a byte-level tokenizer, so:

* output lengths are set by ``max_tokens`` (the runner sends ``ignore_eos``);
* the returned text is junk and never steers a program: branch choices, tree
  values and early stops come from the program's own seeded RNG;
* one token is one UTF-8 byte: every prompt (content bytes plus
  :data:`MESSAGE_OVERHEAD` per message) plus ``max_tokens`` stays within
  :data:`CONTEXT_LIMIT`, dropping old history (never the system message) when needed.

Two calibrations: ``"paper"`` sizes prompts and outputs to the paper's per-workload
statistics (:data:`PAPER_STATS`, measured there in real tokens, here in bytes);
``"raw"`` feeds the real text (ShareGPT turns, full BFCL tool docs and results,
LATS-size few-shot templates), cut only to fit the context.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Protocol

from autellix.bench.data import (
    BfclEntry,
    BfclFunction,
    HotpotQuestion,
    ShareGPTConversation,
    load_bfcl,
    load_bfcl_functions,
    load_hotpotqa,
    load_sharegpt,
    workloads_dir,
)

Message = dict[str, str]

#: Prompt tokens plus max_tokens stay within this (the engine's context is 8192).
CONTEXT_LIMIT = 8000
#: Chat-template tokens counted per message on top of its content bytes.
MESSAGE_OVERHEAD = 40

WORKLOADS: tuple[str, ...] = ("sharegpt", "bfcl", "lats", "fanout", "mixed")
CALIBRATIONS: tuple[str, ...] = ("paper", "raw")
#: The kinds of program "mixed" interleaves ("multiagent": fanout's multi-agent programs).
MIXED_KINDS: tuple[str, ...] = ("sharegpt", "bfcl", "lats", "multiagent")

#: Thread name of the single-threaded programs (sharegpt, bfcl).
MAIN_THREAD = "main"


@dataclass(frozen=True)
class WorkloadStats:
    calls_mean: float
    calls_max: int
    prefill_mean: float
    decode_mean: float


#: The paper's per-workload measurements (tokens; README of the workload data).
PAPER_STATS: dict[str, WorkloadStats] = {
    "sharegpt": WorkloadStats(6.66, 80, 255.65, 276.81),
    "bfcl": WorkloadStats(10.75, 70, 735.06, 34.14),
    "lats": WorkloadStats(159.71, 400, 467.24, 72.64),
}


class LLM(Protocol):
    async def chat(self, messages: list[dict[str, str]], *, max_tokens: int, thread: str | None = None) -> str: ...

    async def tool(self, seconds: float) -> None:
        """A simulated tool call: ``seconds`` spent outside the engine."""
        ...


@dataclass(frozen=True)
class AgentProgram:
    workload: str  # "sharegpt" | "bfcl" | "lats"
    program_id: str
    run: Callable[[LLM], Awaitable[None]]  # the program; all randomness fixed at construction (seeded)
    expected_calls: int | None = None  # when known in advance (sharegpt, bfcl); None for lats


# --------------------------------------------------------------------------- helpers


def prompt_tokens(messages: Sequence[Message]) -> int:
    """Prompt size in tokens of the byte-level engine: content bytes plus template overhead."""
    return sum(len(m["content"].encode("utf-8")) + MESSAGE_OVERHEAD for m in messages)


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8"))


def _clip_head(text: str, max_bytes: int) -> str:
    """The first ``max_bytes`` bytes of ``text`` (never splitting a character)."""
    return text.encode("utf-8")[: max(0, max_bytes)].decode("utf-8", errors="ignore")


def _clip_tail(text: str, max_bytes: int) -> str:
    """The last ``max_bytes`` bytes of ``text`` (never splitting a character)."""
    data = text.encode("utf-8")
    return data[max(0, len(data) - max(0, max_bytes)) :].decode("utf-8", errors="ignore")


def fit_messages(messages: list[Message], max_tokens: int) -> list[Message]:
    """Messages whose prompt plus ``max_tokens`` fits :data:`CONTEXT_LIMIT`.

    Unchanged when they fit. Otherwise the oldest messages after a leading system
    message are dropped, down to half of the room the system message leaves, so
    that the next calls append to a stable prefix again (a prefix cache keeps
    working between two compactions); the kept history starts with a user message
    and always ends with the last message. Content is cut only if the system
    message and the last message alone do not fit (the last one loses its head).
    """
    if prompt_tokens(messages) + max_tokens <= CONTEXT_LIMIT:
        return messages
    head = messages[:1] if messages and messages[0]["role"] == "system" else []
    rest = messages[len(head) :]
    room = CONTEXT_LIMIT - prompt_tokens(head)
    target = room // 2
    while len(rest) > 1 and (prompt_tokens(rest) + max_tokens > target or rest[0]["role"] != "user"):
        rest = rest[1:]
    out = head + rest
    excess = prompt_tokens(out) + max_tokens - CONTEXT_LIMIT
    if excess > 0 and rest:
        last = rest[-1]
        keep = max(0, _nbytes(last["content"]) - excess)
        out[-1] = {"role": last["role"], "content": _clip_tail(last["content"], keep)}
        excess = prompt_tokens(out) + max_tokens - CONTEXT_LIMIT
    if excess > 0 and head:
        keep = max(0, _nbytes(head[0]["content"]) - excess)
        out[0] = {"role": "system", "content": _clip_head(head[0]["content"], keep)}
    return out


@functools.cache
def _discrete_lognormal(mean: float, lo: int, hi: int, sigma: float) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """A lognormal shape on the integers lo..hi whose mean is exactly ``mean``: (values, cumulative weights)."""
    values = tuple(range(lo, hi + 1))
    logs = [math.log(v) for v in values]

    def weights(mu: float) -> list[float]:
        return [math.exp(-((lv - mu) ** 2) / (2 * sigma * sigma)) / v for lv, v in zip(logs, values, strict=True)]

    def mean_of(mu: float) -> float:
        w = weights(mu)
        return sum(v * x for v, x in zip(values, w, strict=True)) / sum(w)

    a, b = math.log(lo) - 3 * sigma, math.log(hi) + 3 * sigma
    for _ in range(80):
        mid = (a + b) / 2
        if mean_of(mid) < mean:
            a = mid
        else:
            b = mid
    return values, tuple(accumulate(weights((a + b) / 2)))


def _draw(rng: random.Random, mean: float, lo: int, hi: int, sigma: float) -> int:
    values, cum = _discrete_lognormal(mean, lo, hi, sigma)
    return rng.choices(values, cum_weights=cum)[0]


def _user(text: str) -> Message:
    return {"role": "user", "content": text}


def _assistant(text: str) -> Message:
    return {"role": "assistant", "content": text}


# --------------------------------------------------------------------------- ShareGPT

#: Turns per program: mean 6.66 on 1..80 with a long tail (paper: mean 6.66, max 80).
SHAREGPT_TURNS = (6.66, 1, 80, 1.0)
#: Output tokens per call: paper mean 276.81, clipped to 1..1024.
SHAREGPT_DECODE = (276.81, 1, 1024, 0.8)
#: "paper": bytes of new user text per turn, so that a call's uncached prefill
#: (its user message plus template overhead; the rest of the history is the
#: thread's previous prompt and reply) averages the paper's 255.65.
SHAREGPT_USER_BYTES = (145.0, 8, 2048, 0.7)


@dataclass(frozen=True)
class _ChatTurn:
    text: str
    max_tokens: int


def _snap_cut(text: str, start: int, end: int) -> int:
    """``end`` moved back to a whitespace after the middle of text[start:end] when there is one."""
    if end >= len(text):
        return len(text)
    cut = max(text.rfind("\n", (start + end) // 2, end), text.rfind(" ", (start + end) // 2, end))
    return cut if cut > start else end


def _sharegpt_texts(
    rng: random.Random, convs: Sequence[ShareGPTConversation], turns: int, calibration: str
) -> list[str]:
    conv = rng.randrange(len(convs))
    text = convs[conv].text
    if calibration == "raw":
        # The whole real conversation, spread over the program's turns at whitespace.
        out: list[str] = []
        start = 0
        for k in range(1, turns + 1):
            end = _snap_cut(text, start, round(k * len(text) / turns))
            out.append(text[start:end].strip() or "...")
            start = end
        return out
    # "paper": short consecutive slices of real text, continuing in the next conversation when one runs out.
    out = []
    pos = text.find("\n", rng.randrange(len(text))) + 1  # from a line start (0 when none is left)
    for _ in range(turns):
        length = _draw(rng, *SHAREGPT_USER_BYTES)
        if pos >= len(text):
            conv = (conv + 1) % len(convs)
            text, pos = convs[conv].text, 0
        end = _snap_cut(text, pos, pos + length)
        out.append(text[pos:end].strip() or "...")
        pos = end
    return out


def _sharegpt_program(
    program_id: str, rng: random.Random, convs: Sequence[ShareGPTConversation], calibration: str
) -> AgentProgram:
    turns = _draw(rng, *SHAREGPT_TURNS)
    texts = _sharegpt_texts(rng, convs, turns, calibration)
    plan = tuple(_ChatTurn(t, _draw(rng, *SHAREGPT_DECODE)) for t in texts)

    async def run(llm: LLM) -> None:
        history: list[Message] = []
        for turn in plan:
            history = fit_messages([*history, _user(turn.text)], turn.max_tokens)
            reply = await llm.chat(list(history), max_tokens=turn.max_tokens, thread=MAIN_THREAD)
            history.append(_assistant(reply))

    return AgentProgram("sharegpt", program_id, run, expected_calls=len(plan))


# --------------------------------------------------------------------------- BFCL

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
class _ToolStep:
    max_tokens: int
    delay: float
    result: str


@dataclass(frozen=True)
class _ReactTurn:
    text: str
    steps: tuple[_ToolStep, ...]
    reply_tokens: int


def _call_name(call: str) -> str:
    return call.split("(", 1)[0].strip()


def _bfcl_system(entry: BfclEntry, funcs: Sequence[BfclFunction], calibration: str) -> str:
    used = {_call_name(c) for turn in entry.ground_truth for c in turn}
    ordered = [f for f in funcs if f.name in used] + [f for f in funcs if f.name not in used]
    if calibration == "raw":
        lines, budget = [f.doc for f in ordered], BFCL_SYSTEM_RAW
    else:
        lines, budget = [f"{f.name}: {f.description}" for f in ordered], BFCL_SYSTEM_PAPER
    text = BFCL_INSTRUCTIONS
    for line in lines:
        if _nbytes(text) + _nbytes(line) + 1 > budget:
            break
        text += line + "\n"
    return _clip_head(text, budget)


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


def _tool_result(rng: random.Random, func: BfclFunction | None, ok: bool, category: str, calibration: str) -> str:
    if not ok:
        return json.dumps({"error": "Invalid arguments; check the parameters and try again."})
    fields = func.response_fields if func else ()
    if calibration == "paper":
        name, kind = fields[0] if fields else ("result", "string")
        value = _fake_value(rng, kind)
        return json.dumps({name: value if not isinstance(value, list | dict) else "ok"})
    result: dict[str, object] = {name: _fake_value(rng, kind) for name, kind in fields} or {"result": "ok"}
    if category == "long_context":
        result["details"] = _clip_head(" ".join(f"entry_{rng.randrange(10**6)}" for _ in range(200)), BFCL_LONG_RESULT)
    return json.dumps(result)


def _bfcl_program(
    program_id: str,
    rng: random.Random,
    entries: Sequence[BfclEntry],
    functions: dict[str, tuple[BfclFunction, ...]],
    calibration: str,
) -> AgentProgram:
    entry = entries[rng.randrange(len(entries))]
    missed = {name for names in entry.missed_functions.values() for name in names}
    funcs = [f for cls in entry.involved_classes for f in functions.get(cls, ())]
    by_name = {f.name: f for f in funcs}
    system = _bfcl_system(entry, [f for f in funcs if f.name not in missed], calibration)
    retry = rng.uniform(*BFCL_RETRY[rng.random() < BFCL_STRUGGLING])
    made = 0  # calls planned so far
    turns: list[_ReactTurn] = []
    for t, user_messages in enumerate(entry.turns):
        if user_messages:
            text = "\n".join(user_messages)
        else:  # miss_func: the held-out functions become available at this turn
            added = [by_name[n] for n in entry.missed_functions.get(t, ()) if n in by_name]
            docs = [f.doc if calibration == "raw" else f"{f.name}: {f.description}" for f in added]
            text = "More functions are available now:\n" + "\n".join(docs)
        truth = entry.ground_truth[t] if t < len(entry.ground_truth) else ()
        steps: list[_ToolStep] = []
        for call in truth:
            ok = False
            while not ok and len(steps) < BFCL_MAX_STEPS and made + len(steps) + 1 < BFCL_MAX_CALLS:
                ok = rng.random() >= retry
                tokens = min(max(1, _nbytes(call)), 256) if calibration == "raw" else _draw(rng, *BFCL_DECODE)
                delay = round(rng.uniform(*BFCL_TOOL_DELAY), 3)
                result = _tool_result(rng, by_name.get(_call_name(call)), ok, entry.category, calibration)
                steps.append(_ToolStep(tokens, delay, result))
        turns.append(_ReactTurn(text, tuple(steps), _draw(rng, *BFCL_DECODE)))
        made += len(steps) + 1
    plan = tuple(turns)
    per_turn = calibration == "paper"

    async def run(llm: LLM) -> None:
        sys_msg: Message = {"role": "system", "content": system}
        history: list[Message] = [sys_msg]
        for turn in plan:
            if per_turn:  # each request is a fresh ReAct episode over the same tool docs
                history = [sys_msg]
            history.append(_user(turn.text))
            for step in turn.steps:
                history = fit_messages(history, step.max_tokens)
                call = await llm.chat(list(history), max_tokens=step.max_tokens, thread=MAIN_THREAD)
                await llm.tool(step.delay)
                history += [_assistant(call), _user("Observation: " + step.result)]
            history = fit_messages(history, turn.reply_tokens)
            reply = await llm.chat(list(history), max_tokens=turn.reply_tokens, thread=MAIN_THREAD)
            history.append(_assistant(reply))

    calls = sum(len(t.steps) + 1 for t in plan)
    return AgentProgram("bfcl", program_id, run, expected_calls=calls)


# --------------------------------------------------------------------------- LATS

LATS_SAMPLES = 5  # children per expansion, sampled in parallel
LATS_ROLLOUT_DEPTH = 4  # sequential steps of a rollout from the best child
LATS_MAX_DEPTH = 7  # a trajectory ends at this many steps
LATS_MAX_ITERATIONS = 30
LATS_MAX_CALLS = 400
#: Per iteration, the chance that the rollout finds the answer (the search stops).
LATS_SUCCESS = 0.075
#: Per rollout step, the chance that the trajectory finishes (answers) there.
LATS_FINISH = 0.3
LATS_MAX_TOKENS = 100  # per call
LATS_DECODE_BETA = (4.0, 1.53)  # max_tokens = 1 + 99 * Beta(a, b): mean 72.6
LATS_UCT_C = 1.0

LATS_INSTRUCTIONS = {
    "expand": (
        "Solve a question answering task with interleaving Thought, Action, Observation steps. Thought can reason "
        "about the current situation, and Action can be three types: Search[entity], Lookup[keyword], "
        "Finish[answer]. Give the next Thought and Action.\n"
    ),
    "value": (
        "Analyze the trajectories of a solution to a question answering task. Judge whether the thoughts and "
        "actions lead to the correct answer, then end with: Thus the correctness score is N (1 to 10).\n"
    ),
    "reflect": (
        "You are an advanced reasoning agent that can improve based on self reflection. The trial below failed. "
        "Diagnose the reason for failure in a few sentences and devise a new, concise, high level plan.\n"
    ),
}
#: "paper": one-line instructions and the latest reflection only, so that calls
#: average the paper's 467 prefill tokens (the trajectory so far is most of a prompt).
LATS_SHORT_INSTRUCTIONS = {
    "expand": "Answer with interleaved Thought and Action steps (Search[entity], Lookup[keyword], Finish[answer]).\n",
    "value": "Judge the trajectory; end with: Thus the correctness score is N (1 to 10).\n",
    "reflect": "This trial failed. Say why in a few sentences and give a new, concise plan.\n",
}
#: "raw": template bytes per call kind (instructions plus HotpotQA worked examples),
#: approaching LATS's 1.1k-2.9k-token few-shot templates as far as the 8k byte-level context allows.
LATS_TEMPLATE_BYTES = {"expand": 6000, "value": 4400, "reflect": 4400}
#: Reflections of earlier failed trials shown in expansion prompts.
LATS_MEMORY = {"paper": 1, "raw": 2}


def _lats_example(q: HotpotQuestion, kind: str) -> str:
    steps = (
        f"Question: {q.question}\n"
        f"Thought 1: I need to search for the entities in the question and find the facts that connect them.\n"
        f"Action 1: Search[{q.question.split('?')[0][:60]}]\n"
        f"Observation 1: The search returns the relevant paragraph about the subject.\n"
        f"Thought 2: The paragraph states the answer, so the answer is {q.answer}.\n"
        f"Action 2: Finish[{q.answer}]\n"
    )
    if kind == "value":
        return (
            steps
            + "This trajectory is correct as it answers with facts from the search.\n"
            + "Thus the correctness score is 10\n\n"
        )
    if kind == "reflect":
        return steps + "Reflection: I searched too broadly before; I should search each entity, then compare.\n\n"
    return steps + "\n"


@functools.cache
def _lats_template(kind: str, size: int, root: Path) -> str:
    """A few-shot template of ``size`` bytes: the instructions, then worked examples from HotpotQA."""
    text = LATS_INSTRUCTIONS[kind]
    questions = load_hotpotqa(root)
    i = 0
    while _nbytes(text) < size and i < len(questions):
        text += _lats_example(questions[-1 - i], kind)  # examples from the end, programs draw from anywhere
        i += 1
    return _clip_head(text, size)


@dataclass
class _Node:
    id: int
    parent: _Node | None
    depth: int
    steps: tuple[str, ...]
    visits: int = 0
    value: float = 0.0
    children: list[_Node] = field(default_factory=list)


def _uct(node: _Node, parent_visits: int) -> float:
    if node.visits == 0:
        return math.inf
    return node.value / node.visits + LATS_UCT_C * math.sqrt(math.log(max(parent_visits, 1)) / node.visits)


def _lats_program(
    program_id: str, seed_key: str, question: HotpotQuestion, root: Path, calibration: str
) -> AgentProgram:
    if calibration == "raw":
        templates = {kind: _lats_template(kind, size, root) for kind, size in LATS_TEMPLATE_BYTES.items()}
    else:
        templates = dict(LATS_SHORT_INSTRUCTIONS)
    memory_size = LATS_MEMORY[calibration]

    def prompt(kind: str, body: list[str], max_tokens: int) -> list[Message]:
        # LATS sends each prompt as one user message: the kind's template (a prefix shared by all
        # calls of that kind), the question, then the newest part of the trajectory that fits.
        head = f"{templates[kind]}Question: {question.question}\n"
        room = CONTEXT_LIMIT - max_tokens - MESSAGE_OVERHEAD - _nbytes(head)
        return [_user(head + _clip_tail("\n".join(body), room))]

    def trajectory(steps: Sequence[str]) -> list[str]:
        return [f"Step {i + 1}: {s}" for i, s in enumerate(steps)]

    async def run(llm: LLM) -> None:
        rng = random.Random(seed_key)  # the tree search's choices; drawn only outside concurrent sections

        def tokens() -> int:
            return 1 + round((LATS_MAX_TOKENS - 1) * rng.betavariate(*LATS_DECODE_BETA))

        async def expand_and_value(
            node: _Node, child: _Node, expand_prompt: list[Message], expand_tokens: int, value_tokens: int, i: int
        ) -> None:
            # the samples share one prompt; each child's value call follows its own expansion
            text = await llm.chat(expand_prompt, max_tokens=expand_tokens, thread=f"n{node.id}-s{i}")
            child.steps = (*node.steps, text)
            value_prompt = prompt("value", trajectory(child.steps), value_tokens)
            await llm.chat(value_prompt, max_tokens=value_tokens, thread=f"n{child.id}-v")

        reflections: list[str] = []
        tree = _Node(0, None, 0, ())
        next_id = 1
        calls = 0
        per_iteration = 2 * LATS_SAMPLES + LATS_ROLLOUT_DEPTH + 1
        for it in range(LATS_MAX_ITERATIONS):
            if calls + per_iteration > LATS_MAX_CALLS:
                break
            node = tree  # selection: descend by UCT to a leaf
            while node.children and node.depth < LATS_MAX_DEPTH - 1:
                node = max(node.children, key=lambda c, n=node: _uct(c, n.visits))
            memory = [f"Reflection: {r}" for r in reflections[-memory_size:]]
            expand_tokens = [tokens() for _ in range(LATS_SAMPLES)]
            value_tokens = [tokens() for _ in range(LATS_SAMPLES)]
            children = [_Node(next_id + i, node, node.depth + 1, ()) for i in range(LATS_SAMPLES)]
            next_id += LATS_SAMPLES
            expand_prompt = prompt("expand", memory + trajectory(node.steps), max(expand_tokens))

            await asyncio.gather(
                *(
                    expand_and_value(node, child, expand_prompt, expand_tokens[i], value_tokens[i], i)
                    for i, child in enumerate(children)
                )
            )
            calls += 2 * LATS_SAMPLES
            node.children.extend(children)
            scores = [rng.random() for _ in children]  # the value calls' judgments (their text is junk)
            best_i = max(range(LATS_SAMPLES), key=scores.__getitem__)
            best = children[best_i]
            best.visits, best.value = 1, scores[best_i]
            for i, child in enumerate(children):
                if i != best_i:
                    child.visits, child.value = 1, scores[i]
            steps = list(best.steps)
            for _ in range(LATS_ROLLOUT_DEPTH):  # rollout: a sequential simulation from the best child
                if len(steps) >= LATS_MAX_DEPTH:
                    break
                n = tokens()
                steps.append(
                    await llm.chat(prompt("expand", memory + trajectory(steps), n), max_tokens=n, thread=f"r{it}")
                )
                calls += 1
                if rng.random() < LATS_FINISH:
                    break
            solved = rng.random() < LATS_SUCCESS
            reward = 1.0 if solved else scores[best_i]
            up: _Node | None = node
            while up is not None:  # backpropagation
                up.visits += 1
                up.value += reward
                up = up.parent
            if solved:
                break
            n = tokens()
            reflections.append(
                await llm.chat(prompt("reflect", trajectory(steps), n), max_tokens=n, thread=f"r{it}-reflect")
            )
            calls += 1

    return AgentProgram("lats", program_id, run, expected_calls=None)


# --------------------------------------------------------------------------- fan-out multi-agent

#: ``fanout``: this share of programs are multi-agent rounds, the rest short chats.
FANOUT_MULTIAGENT_SHARE = 0.2
#: Rounds per multi-agent program, and agents (parallel calls) per round.
FANOUT_ROUNDS = (2, 4)
FANOUT_AGENTS = (4, 16)
#: Bytes of the long prompt every agent of a program shares (real ShareGPT text).
FANOUT_SHARED_BYTES = (2500, 3500)
#: Output tokens per agent call: up to 400, mean about 250.
FANOUT_DECODE = (250.0, 32, 400, 0.5)
#: Bytes of the previous round's replies shown to every agent of the next round.
FANOUT_DIGEST_BYTES = 1200
#: Short chats beside them: turns, and output tokens per turn.
CHAT_TURNS = (2, 4)
CHAT_DECODE = (30, 120)
FANOUT_TOOL_DELAY = (0.05, 0.3)


def _long_text(rng: random.Random, convs: Sequence[ShareGPTConversation], size: int) -> str:
    """``size`` bytes of consecutive real text, from a line start of a random conversation onwards."""
    conv = rng.randrange(len(convs))
    text, out = convs[conv].text, ""
    pos = text.find("\n", rng.randrange(len(text))) + 1
    while _nbytes(out) < size:
        if pos >= len(text):
            conv = (conv + 1) % len(convs)
            text, pos = convs[conv].text, 0
        piece = text[pos : pos + size]
        out += piece
        pos += len(piece)
    return _clip_head(out, size)


def _multiagent_program(program_id: str, rng: random.Random, convs: Sequence[ShareGPTConversation]) -> AgentProgram:
    """A multi-agent debate: each round, ``k`` agents answer in parallel over one
    long shared document (the same prefix), then the next round shows every agent
    a digest of the last round's answers. Its critical path is one call a round;
    its engine use is ``k`` calls a round."""
    rounds = rng.randint(*FANOUT_ROUNDS)
    agents = rng.randint(*FANOUT_AGENTS)
    document = _long_text(rng, convs, rng.randint(*FANOUT_SHARED_BYTES))
    plan = tuple(tuple(_draw(rng, *FANOUT_DECODE) for _ in range(agents)) for _ in range(rounds))
    delay = round(rng.uniform(*FANOUT_TOOL_DELAY), 3)
    system = "You are one of several agents debating the document below. Be concise.\n" + document

    async def run(llm: LLM) -> None:
        digest = ""
        for r, tokens in enumerate(plan):
            async def agent(i: int, max_tokens: int, r: int = r, digest: str = digest) -> str:
                task = (f"Round {r + 1}. " + (f"The other agents said:\n{digest}\n" if digest else "")
                        + f"You are agent {i + 1}: give your position.")
                messages = fit_messages([{"role": "system", "content": system}, _user(task)], max_tokens)
                return await llm.chat(messages, max_tokens=max_tokens, thread=f"agent{i}")

            replies = await asyncio.gather(*(agent(i, n) for i, n in enumerate(tokens)))
            digest = _clip_tail("\n".join(replies), FANOUT_DIGEST_BYTES)
            await llm.tool(delay)  # the coordinator merges the round

    return AgentProgram("multiagent", program_id, run, expected_calls=rounds * agents)


def _chat_program(program_id: str, rng: random.Random, convs: Sequence[ShareGPTConversation]) -> AgentProgram:
    """A short chat: 2-4 turns of real ShareGPT text, 30-120 output tokens a turn."""
    turns = rng.randint(*CHAT_TURNS)
    texts = _sharegpt_texts(rng, convs, turns, "paper")
    plan = tuple(_ChatTurn(t, rng.randint(*CHAT_DECODE)) for t in texts)

    async def run(llm: LLM) -> None:
        history: list[Message] = []
        for turn in plan:
            history = fit_messages([*history, _user(turn.text)], turn.max_tokens)
            reply = await llm.chat(list(history), max_tokens=turn.max_tokens, thread=MAIN_THREAD)
            history.append(_assistant(reply))

    return AgentProgram("chat", program_id, run, expected_calls=len(plan))


# --------------------------------------------------------------------------- entry point


def _program_rng(seed: int, workload: str, index: int) -> tuple[str, random.Random]:
    key = f"{seed}:{workload}:{index}"
    return key, random.Random(key)


def _build(workload: str, indices: Sequence[int], seed: int, calibration: str, root: Path) -> list[AgentProgram]:
    out: list[AgentProgram] = []
    if workload == "sharegpt":
        convs = load_sharegpt(root)
        for i in indices:
            _, rng = _program_rng(seed, workload, i)
            out.append(_sharegpt_program(f"sharegpt-{seed}-{i}", rng, convs, calibration))
    elif workload == "bfcl":
        entries, functions = load_bfcl(root), load_bfcl_functions(root)
        for i in indices:
            _, rng = _program_rng(seed, workload, i)
            out.append(_bfcl_program(f"bfcl-{seed}-{i}", rng, entries, functions, calibration))
    elif workload == "multiagent":
        convs = load_sharegpt(root)
        for i in indices:
            _, rng = _program_rng(seed, workload, i)
            out.append(_multiagent_program(f"multiagent-{seed}-{i}", rng, convs))
    elif workload == "fanout":  # multi-agent programs among short chats, each program's kind drawn
        convs = load_sharegpt(root)
        for i in indices:
            _, rng = _program_rng(seed, workload, i)
            if rng.random() < FANOUT_MULTIAGENT_SHARE:
                out.append(_multiagent_program(f"fanout-{seed}-{i}", rng, convs))
            else:
                out.append(_chat_program(f"chat-{seed}-{i}", rng, convs))
    else:
        questions = load_hotpotqa(root)
        for i in indices:
            key, rng = _program_rng(seed, workload, i)
            question = questions[rng.randrange(len(questions))]
            out.append(_lats_program(f"lats-{seed}-{i}", key + ":run", question, root, calibration))
    return out


def make_programs(
    workload: str, count: int, *, seed: int, calibration: str = "paper", data_dir: Path | None = None
) -> list[AgentProgram]:
    """``count`` programs of ``workload`` ("sharegpt", "bfcl", "lats", "fanout" or "mixed"),
    deterministic in ``seed``.

    Program ``i`` of a workload draws everything from ``random.Random(f"{seed}:{workload}:{i}")``.
    "fanout" is multi-agent programs (rounds of 4-16 parallel calls over one long
    shared prompt; ``FANOUT_MULTIAGENT_SHARE`` of them) among short chats.
    "mixed" is an equal share of sharegpt, bfcl, lats and multi-agent programs
    (the first ones differing by at most one), in blocks of four, one of each
    kind in a seeded order; its programs are the same as the first programs of
    each single kind with the same seed.
    """
    if workload not in WORKLOADS and workload not in MIXED_KINDS:  # "multiagent": fanout's wide programs alone
        raise ValueError(f"unknown workload {workload!r}; choose one of {', '.join(WORKLOADS)}")
    if calibration not in CALIBRATIONS:
        raise ValueError(f"unknown calibration {calibration!r}; choose one of {', '.join(CALIBRATIONS)}")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    root = workloads_dir(data_dir).resolve()
    if workload != "mixed":
        return _build(workload, range(count), seed, calibration, root)
    kinds = MIXED_KINDS
    shares = [count // len(kinds) + (1 if k < count % len(kinds) else 0) for k in range(len(kinds))]
    pools = {kind: _build(kind, range(n), seed, calibration, root) for kind, n in zip(kinds, shares, strict=True)}
    order = random.Random(f"{seed}:mixed")
    taken = dict.fromkeys(kinds, 0)
    out: list[AgentProgram] = []
    while len(out) < count:
        for kind in order.sample(kinds, len(kinds)):
            if taken[kind] < len(pools[kind]):
                out.append(pools[kind][taken[kind]])
                taken[kind] += 1
    return out
