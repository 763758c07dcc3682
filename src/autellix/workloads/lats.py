"""LATS: a tree search over a HotpotQA question; expansions sample children in parallel."""

from __future__ import annotations

import asyncio
import functools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autellix.workloads.base import (
    CONTEXT_LIMIT,
    LLM,
    MESSAGE_OVERHEAD,
    AgentProgram,
    Message,
    clip_head,
    clip_tail,
    nbytes,
    program_rng,
    user_message,
)
from autellix.workloads.data import (
    HotpotQuestion,
    load_hotpotqa,
)

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
    while nbytes(text) < size and i < len(questions):
        text += _lats_example(questions[-1 - i], kind)  # examples from the end, programs draw from anywhere
        i += 1
    return clip_head(text, size)


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


def lats_program(
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
        room = CONTEXT_LIMIT - max_tokens - MESSAGE_OVERHEAD - nbytes(head)
        return [user_message(head + clip_tail("\n".join(body), room))]

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
            for child, score in zip(children, scores, strict=True):
                child.visits, child.value = 1, score
            best_i = max(range(LATS_SAMPLES), key=scores.__getitem__)
            steps = list(children[best_i].steps)
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


def build(indices: Sequence[int], seed: int, calibration: str, root: Path) -> list[AgentProgram]:
    questions = load_hotpotqa(root)
    out: list[AgentProgram] = []
    for i in indices:
        key, rng = program_rng(seed, "lats", i)
        question = questions[rng.randrange(len(questions))]
        out.append(lats_program(f"lats-{seed}-{i}", key + ":run", question, root, calibration))
    return out
