"""The unit-cost step simulator: every batch step costs one time unit.

Each step: finished calls update the process table and release the calls that
depended on them; arrivals enter the multi-level queue; the queue rebalances
(demotion, anti-starvation) and forms a batch of at most ``batch_size`` calls;
every call in the batch decodes one token. This is the policy core running on a
perfectly predictable engine, which is what makes the paper's toy figures exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from autellix.core import MultiLevelQueue, Policy, ProcessTable, SchedulerConfig
from autellix.core.mlq import QueuedCall
from autellix.sim.workloads import CallSpec, ProgramSpec
from autellix.stats import mean, percentile


@dataclass
class CallRecord:
    program_id: str
    call_id: str
    steps: int
    arrival: float
    finish: float = -1.0
    wait: float = 0.0
    #: (start, end) of each stretch the call ran without preemption.
    runs: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class ProgramRecord:
    program_id: str
    arrival: float
    tokens: int
    finish: float = -1.0
    wait: float = 0.0
    service: float = 0.0

    @property
    def token_latency(self) -> float:
        return (self.finish - self.arrival) / self.tokens


@dataclass
class SimResult:
    policy: str
    calls: dict[str, CallRecord]
    programs: dict[str, ProgramRecord]

    @property
    def total_wait(self) -> float:
        return sum(c.wait for c in self.calls.values())

    @property
    def makespan(self) -> float:
        return max((p.finish for p in self.programs.values()), default=0.0)

    def summary(self) -> dict[str, float]:
        latencies = [p.token_latency for p in self.programs.values()]
        return {
            "total_wait": self.total_wait,
            "makespan": self.makespan,
            "mean_token_latency": mean(latencies),
            "p50_token_latency": percentile(latencies, 50),
            "p95_token_latency": percentile(latencies, 95),
            "p99_token_latency": percentile(latencies, 99),
            "mean_response_time": mean([p.finish - p.arrival for p in self.programs.values()]),
            "programs": len(self.programs),
            "calls": len(self.calls),
        }


#: Called after each batch is formed: (time, queue, table, batch). Tests use it
#: to check invariants at every step.
Observer = Callable[[float, MultiLevelQueue, ProcessTable, list[QueuedCall]], None]


def simulate(
    programs: Sequence[ProgramSpec],
    policy: Policy,
    config: SchedulerConfig,
    *,
    batch_size: int,
    observer: Observer | None = None,
    max_steps: int = 10_000_000,
) -> SimResult:
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    table = ProcessTable(policy)
    queue = MultiLevelQueue(policy.queues(config), table.view, places_by_priority=policy.places_by_priority)
    calls: dict[str, CallRecord] = {}
    records = {p.program_id: ProgramRecord(p.program_id, p.arrival, p.tokens) for p in programs}
    if len(records) != len(programs):
        raise ValueError("program ids must be unique")
    specs, owner, waiting_on, dependents = _call_graph(programs)
    left: dict[str, int] = {}  # decode steps still to run, per queued call
    unfinished = {p.program_id: len(p.calls) for p in programs}
    pending = sorted(programs, key=lambda p: p.arrival)  # stable: ties keep input order
    next_program = 0
    remaining_calls = len(specs)
    ready: list[str] = []
    t = 0.0

    def issue(call_id: str, now: float) -> None:
        pid = owner[call_id]
        table.call_arrived(pid, call_id, now)
        queue.add(call_id, pid, now)
        calls[call_id] = CallRecord(pid, call_id, specs[call_id].steps, now)
        left[call_id] = specs[call_id].steps

    for _ in range(max_steps):
        while next_program < len(pending) and pending[next_program].arrival <= t:
            p = pending[next_program]
            next_program += 1
            table.start(p.program_id, t)
            ready.extend(c.call_id for c in p.calls if not c.deps)
        for call_id in ready:
            issue(call_id, t)
        ready.clear()
        if remaining_calls == 0:
            break
        queue.rebalance(t)
        batch = queue.form_batch(_first(batch_size))
        if observer is not None:
            observer(t, queue, table, batch)
        if not batch:  # idle until the next program arrives
            if next_program >= len(pending):
                raise RuntimeError("deadlock: calls remain but none can be issued")
            t = max(t, pending[next_program].arrival)
            continue
        for call in batch:
            runs = calls[call.call_id].runs
            if runs and runs[-1][1] == t:
                runs[-1] = (runs[-1][0], t + 1)
            else:
                runs.append((t, t + 1))
        t += 1
        queue.advance(t)
        queue.charge(batch)
        for call in batch:
            left[call.call_id] -= 1
            if left[call.call_id]:
                continue
            done = queue.remove(call.call_id, t)
            del left[call.call_id]
            remaining_calls -= 1
            pid = done.program_id
            record = calls[call.call_id]
            record.finish, record.wait = t, done.total_wait
            entry = table.call_finished(pid, call.call_id, t, model_time=done.total_model_time, wait=done.total_wait)
            for nxt in dependents.get(call.call_id, ()):
                waiting_on[nxt].discard(call.call_id)
                if not waiting_on[nxt]:
                    ready.append(nxt)
            unfinished[pid] -= 1
            if not unfinished[pid]:
                prog = records[pid]
                prog.finish, prog.wait, prog.service = t, entry.waiting, entry.service
                table.end(pid)
    else:
        raise RuntimeError(f"simulation did not finish within {max_steps} steps")
    return SimResult(policy.name, calls, records)


def _call_graph(programs: Sequence[ProgramSpec]) -> tuple[dict[str, CallSpec], dict[str, str], dict[str, set[str]],
                                                          dict[str, list[str]]]:
    """Every call by id, its program, the calls it waits on and the calls that wait on it."""
    specs: dict[str, CallSpec] = {}
    owner: dict[str, str] = {}
    waiting_on: dict[str, set[str]] = {}
    dependents: dict[str, list[str]] = {}
    for p in programs:
        own_calls = {c.call_id for c in p.calls}
        for c in p.calls:
            if c.call_id in specs:
                raise ValueError(f"call id {c.call_id!r} is used twice")
            if not set(c.deps) <= own_calls:
                raise ValueError(f"call {c.call_id!r} depends on a call outside its program")
            specs[c.call_id], owner[c.call_id] = c, p.program_id
            waiting_on[c.call_id] = set(c.deps)
            for d in c.deps:
                dependents.setdefault(d, []).append(c.call_id)
    return specs, owner, waiting_on, dependents


def _first(n: int) -> Callable[[QueuedCall], bool]:
    """A ``fits`` test that admits the first ``n`` calls: a batch-size limit."""
    taken = 0

    def fits(call: QueuedCall) -> bool:
        nonlocal taken
        taken += 1
        return taken <= n

    return fits
