"""Subagents in the simulator: a fan-out written as subagents, ranked as one program with its parent.

The same fan-out programs (``fanout``: multi-agent rounds of 4-16 parallel calls among short chats) run
three ways on the A100 profile with 32 running slots, past saturation: each multi-agent program's agents
as threads of its own calls; as subagents it spawns, linked to it (``POST /v1/sessions {"parent": ...}``);
and as subagents the gateway does not know to be linked (unrelated programs). Linked, the tree ranks as
the one program it is, so the mean program token latency matches the one-program form's; unlinked,
each subagent starts at zero service in the top queue, ahead of the short chats, and the mean is worse.
"""

from __future__ import annotations

import pytest

from autellix.sim.engine_profile import EngineProfile
from autellix.sim.serving import simulate_programs
from autellix.workloads import make_programs
from autellix.workloads.data import workloads_available
from autellix.workloads.run_metrics import summarize

pytestmark = pytest.mark.skipif(not workloads_available(), reason="workload data (../shared/workloads) not found")

#: The check's most loaded fan-out point with 32 slots (``autellix.sim.sweep.CHECK_LOADS``).
RATE, PROGRAMS, SLOTS = 2.0, 120, 32


def mean_token_latency(workload: str, seed: int, *, link_subagents: bool = True) -> float:
    profile = EngineProfile.load("a100-llama3.1-8b").with_overrides(max_num_seqs=SLOTS)
    programs = make_programs(workload, PROGRAMS, seed=seed)
    run = simulate_programs(programs, profile=profile, system="autellix", rate=RATE, seed=seed,
                            link_subagents=link_subagents)
    summary = summarize(run.result)
    assert summary["completed"] == PROGRAMS
    return summary["mean_token_latency"]


@pytest.mark.parametrize("seed", [1])
def test_subagents_linked_to_their_parent_rank_as_the_same_work_in_one_program(seed: int) -> None:
    one_program = mean_token_latency("fanout", seed)
    linked = mean_token_latency("fanout-subagents", seed)
    unlinked = mean_token_latency("fanout-subagents", seed, link_subagents=False)
    assert linked <= 1.05 * one_program and one_program <= 1.05 * linked, (one_program, linked)
    assert linked < unlinked, (linked, unlinked)
