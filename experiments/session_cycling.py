"""Session cycling against the tenant-standing floor, in the program simulator.

A program that opens a new session for every call starts each call at zero
attained service, in the top queue, ahead of honest programs that keep their
session. The floor rule (``autellix.control.standing``): a tenant keeps the
decayed service of its programs that left the table, and its next new program
starts there. Four runs on the same programs and arrivals (``autellix.sim.serving``,
A100 profile, Autellix's engine scheduler and ATLAS):

  A. everyone honest (one session per program), no rule: the baseline;
  B. one program in ``--cycle-every`` opens a session per call, no rule: what cycling gains;
  C. the same cyclers with the rule: the gain should be gone (cyclers' latency >= A's);
  D. everyone honest with the rule: what the rule costs honest programs (target <= 1.10x A).

The honest programs all share one tenant in C and D (the rule's worst case:
each new program may inherit the carry of the tenant's programs that just
ended); every cycler is a tenant of its own.

    .venv/bin/python experiments/session_cycling.py [--programs 300] [--rate 2.0] [--workload sharegpt]

Metric: mean program token latency (program wall time / tokens), per group.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from typing import Annotated, Any, ClassVar

import typer

import autellix.sim.serving as serving
from autellix.control.standing import TenantStanding
from autellix.core import SchedulerConfig
from autellix.sim.engine_profile import EngineProfile
from autellix.workloads import make_programs

HONEST_TENANT = "honest"


class StandingGateway(serving.SimGateway):
    """The simulator's gateway with tenants: cyclers' calls each in a fresh session,
    and (with ``standing``) every new program starting at its tenant's floor."""

    cyclers: ClassVar[set[str]] = set()
    standing: ClassVar[TenantStanding | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sessions = 0
        table, gateway = self.table, self
        start, end = table.start, table.end

        def start_with_floor(program_id: str, now: float, **options: Any) -> Any:
            entry = start(program_id, now, **options)
            if gateway.standing is not None:
                entry.service = gateway.standing.take_floor(gateway.tenant(program_id), now)
            return entry

        def end_and_carry(program_id: str) -> Any:
            entry = end(program_id)
            if gateway.standing is not None:
                now = asyncio.get_running_loop().time()
                gateway.standing.program_left(gateway.tenant(program_id), entry.service, now)
            return entry

        table.start, table.end = start_with_floor, end_and_carry  # type: ignore[method-assign]

    def tenant(self, program_id: str) -> str:
        owner = program_id.split("#", 1)[0]
        return owner if owner in self.cyclers else HONEST_TENANT

    async def call(self, program_id: str, *args: Any, **kwargs: Any) -> Any:
        if program_id not in self.cyclers:
            return await super().call(program_id, *args, **kwargs)
        self._sessions += 1
        session = f"{program_id}#{self._sessions}"  # a new session for this one call
        self.table.start(session, asyncio.get_running_loop().time())
        try:
            return await super().call(session, *args, **kwargs)
        finally:
            self.table.end(session)


def run(programs: list, cyclers: set[str], rule: bool, *, rate: float, seed: int,
        profile: EngineProfile) -> dict[str, float]:
    StandingGateway.cyclers = cyclers
    StandingGateway.standing = TenantStanding(half_life_s=60.0) if rule else None
    # the simulator builds its gateway by this name: the tenants' variant stands in for this run
    original, serving.SimGateway = serving.SimGateway, StandingGateway  # type: ignore[misc]
    try:
        result = serving.simulate_programs(programs, profile=profile, system="autellix", rate=rate, seed=seed,
                                           config=SchedulerConfig())
    finally:
        serving.SimGateway = original  # type: ignore[misc]
    group = [p.token_latency for p in result.result.programs if p.program_id in marked and p.error is None]
    rest = [p.token_latency for p in result.result.programs if p.program_id not in marked and p.error is None]
    return {"marked": statistics.fmean(group), "honest": statistics.fmean(rest)}


marked: set[str] = set()


def main(programs: Annotated[int, typer.Option()] = 300, rate: Annotated[float, typer.Option()] = 2.0,
         workload: Annotated[str, typer.Option()] = "sharegpt", seed: Annotated[int, typer.Option()] = 1,
         cycle_every: Annotated[int, typer.Option(help="one program in N cycles sessions")] = 4) -> None:
    profile = EngineProfile.load("a100-llama3.1-8b")
    batch = make_programs(workload, programs, seed=seed)
    marked.clear()
    marked.update(p.program_id for i, p in enumerate(batch) if i % cycle_every == 0)
    runs = {
        "A_honest": run(batch, set(), False, rate=rate, seed=seed, profile=profile),
        "B_cycling": run(batch, set(marked), False, rate=rate, seed=seed, profile=profile),
        "C_cycling_rule": run(batch, set(marked), True, rate=rate, seed=seed, profile=profile),
        "D_honest_rule": run(batch, set(), True, rate=rate, seed=seed, profile=profile),
    }
    a = runs["A_honest"]
    report = {
        "settings": {"programs": programs, "rate": rate, "workload": workload, "seed": seed,
                     "cycle_every": cycle_every, "half_life_s": 60.0},
        "mean_token_latency_s": runs,
        # < 1: cycling made the cyclers faster than honest play (a gain)
        "cycler_latency_vs_honest_no_rule": runs["B_cycling"]["marked"] / a["marked"],
        "cycler_latency_vs_honest_with_rule": runs["C_cycling_rule"]["marked"] / a["marked"],
        # the rule's cost to honest programs (target <= 1.10)
        "honest_latency_rule_vs_none": runs["D_honest_rule"]["honest"] / a["honest"],
        "honest_marked_latency_rule_vs_none": runs["D_honest_rule"]["marked"] / a["marked"],
    }
    typer.echo(json.dumps(report, indent=2))


if __name__ == "__main__":
    typer.run(main)
