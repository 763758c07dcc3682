"""Shared-context: agents of many teams, each team's agents over the team's own long system prompt.

Where routing by the engines' caches pays: :data:`CONTEXTS` teams each give
their agents one system prompt of :data:`CONTEXT_BYTES` (tokens): the team's
guidelines (the opening of a ShareGPT conversation drawn for the team, about
:data:`GUIDE_BYTES`), then the BFCL instructions and the JSON docs of the
team's two API classes. Every team's prompt differs from its first block, and
together they outgrow what one engine's KV cache keeps beside the running
programs' own histories, so an engine that sees every team keeps evicting
them; spread by team over several engines they stay cached.

A program belongs to a team drawn uniformly and runs ``tool_pause``'s ReAct
loop over a seeded BFCL entry (the whole history in its prompt, one call per
tool step and per reply), pausing for tool latencies drawn log-normally
around :data:`TOOL_MEDIAN_S`: short pauses, so what decides its latency is
where its calls run and what is cached there. The teams' prompts do not
depend on the seed: the same contexts in every run.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from autellix.workloads.base import AgentProgram, clip_head, program_rng
from autellix.workloads.bfcl import BFCL_INSTRUCTIONS
from autellix.workloads.data import BFCL_CLASS_FILES, BfclFunction, load_bfcl, load_bfcl_functions, load_sharegpt
from autellix.workloads.tool_pause import ToolLatency, tool_pause_program

WORKLOAD = "shared-context"
#: Teams, each with its own system prompt.
CONTEXTS = 64
#: Bytes (tokens) of a team's system prompt.
CONTEXT_BYTES = 6144
#: Bytes of the team's guidelines at its start.
GUIDE_BYTES = 1024
TOOL_MEDIAN_S = 0.25
TOOL_LATENCY = ToolLatency(median_s=TOOL_MEDIAN_S, sigma=1.0, min_s=0.02, max_s=10.0)


def team_contexts(root: Path, count: int = CONTEXTS) -> tuple[str, ...]:
    """The ``count`` teams' system prompts (the same for every seed)."""
    functions = load_bfcl_functions(root)
    conversations = load_sharegpt(root)
    classes = list(BFCL_CLASS_FILES)
    out = []
    for team in range(count):
        rng = random.Random(f"{WORKLOAD}:team:{team}")
        guide = clip_head(conversations[rng.randrange(len(conversations))].text, GUIDE_BYTES)
        tools: list[BfclFunction] = [f for cls in rng.sample(classes, 2) for f in functions.get(cls, ())]
        docs = "\n".join(f.doc for f in tools)
        out.append(clip_head(f"Team {team} guidelines:\n{guide}\n{BFCL_INSTRUCTIONS}{docs}", CONTEXT_BYTES))
    return tuple(out)


def build(indices: Sequence[int], seed: int, calibration: str, root: Path) -> list[AgentProgram]:
    """Programs ``indices`` (both calibrations give the same programs)."""
    entries, functions, contexts = load_bfcl(root), load_bfcl_functions(root), team_contexts(root)
    programs = []
    for i in indices:
        rng = program_rng(seed, WORKLOAD, i)[1]
        system = contexts[rng.randrange(len(contexts))]
        programs.append(tool_pause_program(f"{WORKLOAD}-{seed}-{i}", rng, entries, functions, TOOL_LATENCY,
                                           system=system, workload=WORKLOAD))
    return programs
