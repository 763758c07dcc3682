"""Agent programs for the program-level serving benchmark and simulator (Autellix paper, section 6).

A program is an async function that drives an :class:`LLM` (the benchmark's
HTTP client, or the simulator's modelled gateway): a ShareGPT multi-turn chat
(``sharegpt``), a BFCL v3 ReAct tool loop (``bfcl``), a LATS tree search over
a HotpotQA question (``lats``), multi-agent fan-out among short chats
(``fanout``), an interleaving of them (``mixed``), BFCL programs that
pause for real-looking tool latencies (``tool-pause``), or a chat of
Mooncake's production trace (``mooncake``). ``make_programs`` builds
them from the shared workload data (``data``) with every random choice seeded
per program, so the same seed gives the same programs and, against a
deterministic LLM, the same calls. What they share is in ``base``; the run's
records and metrics in ``metrics``. Both ``autellix.loadgen`` and
``autellix.sim`` import this package; it imports neither.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from autellix.workloads import bfcl, fanout, lats, mixed, mooncake, shared_context, sharegpt, tool_pause
from autellix.workloads.base import (
    CALIBRATIONS,
    CONTEXT_LIMIT,
    LLM,
    MESSAGE_OVERHEAD,
    AgentProgram,
    client_priority,
    fit_messages,
)
from autellix.workloads.data import workloads_dir

#: ``build(indices, seed, calibration, data root)``: programs ``indices`` of one workload.
Builder = Callable[[Sequence[int], int, str, Path], list[AgentProgram]]

#: The single-kind workloads, each built by its module ("multiagent": fanout's wide programs alone).
BUILDERS: dict[str, Builder] = {
    "sharegpt": sharegpt.build,
    "bfcl": bfcl.build,
    "lats": lats.build,
    "fanout": fanout.build,
    "fanout-subagents": fanout.build_with_subagents,
    "multiagent": fanout.build_multiagent,
    tool_pause.WORKLOAD: tool_pause.build,
    shared_context.WORKLOAD: shared_context.build,
    mooncake.WORKLOAD: mooncake.build,
}

WORKLOADS: tuple[str, ...] = ("sharegpt", "bfcl", "lats", "fanout", "mixed", tool_pause.WORKLOAD,
                              shared_context.WORKLOAD, mooncake.WORKLOAD)


def make_programs(
    workload: str, count: int, *, seed: int, calibration: str = "paper", data_dir: Path | None = None
) -> list[AgentProgram]:
    """``count`` programs of ``workload`` ("sharegpt", "bfcl", "lats", "fanout", "mixed", "tool-pause",
    "shared-context" or "mooncake"), deterministic in ``seed``.

    Program ``i`` of a workload draws everything from ``random.Random(f"{seed}:{workload}:{i}")``.
    "fanout" is multi-agent programs (rounds of 4-16 parallel calls over one long
    shared prompt; ``fanout.FANOUT_MULTIAGENT_SHARE`` of them) among short chats.
    "mixed" is an equal share of sharegpt, bfcl, lats and multi-agent programs
    (``mixed.build``). "tool-pause" is BFCL programs that wait for log-normal
    tool latencies over long shared tool docs (``tool_pause``). "shared-context" is such programs of many
    teams, each team's over its own long system prompt (``shared_context``). "mooncake" is the multi-turn
    chats of Mooncake's production trace, scaled (``mooncake``). "fanout-subagents"
    is "fanout" with each multi-agent program's agents written as subagents.
    """
    if workload not in BUILDERS and workload != "mixed":
        raise ValueError(f"unknown workload {workload!r}; choose one of {', '.join(WORKLOADS)}")
    if calibration not in CALIBRATIONS:
        raise ValueError(f"unknown calibration {calibration!r}; choose one of {', '.join(CALIBRATIONS)}")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    root = workloads_dir(data_dir).resolve()
    if workload != "mixed":
        return BUILDERS[workload](range(count), seed, calibration, root)
    return mixed.build(count, seed, lambda kind, indices: BUILDERS[kind](indices, seed, calibration, root))


__all__ = ["BUILDERS", "CALIBRATIONS", "CONTEXT_LIMIT", "LLM", "MESSAGE_OVERHEAD", "WORKLOADS", "AgentProgram",
           "client_priority", "fit_messages", "make_programs"]
