"""Keep a CPU engine's model workers on cores of their own.

vLLM's CPU backend binds each model worker's OpenMP threads to cores (on a
2-core machine, one of them) and leaves every other process free to run
anywhere, the worker's core included: the engine's API server, its engine
core (which busy-waits on the worker between steps), and, in a benchmark, the
gateway and the client. Which of them land on the worker's core changes from
run to run, and with it how much of its core the model gets. On this 2-core
machine the same programs measured 10.9 to 15.8 ms per token for vllm-opt from
one run to the next. With everything else moved off the workers' cores, two
draws that measured 2x apart on shared cores came out within 4% of each other,
and the CPU engine behaves like a GPU engine, whose compute the serving
processes never take. On two cores, though, that leaves one core for all the
rest, which a gateway stack outgrows at high call rates: opt-in
(``autellix bench sweep --isolate-cores``; docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import psutil

#: vLLM names its model-worker processes so (``setproctitle``).
WORKER_TITLE = "VLLM::Worker"
#: ... and its engine-core processes so.
ENGINE_CORE_TITLE = "VLLM::EngineCore"


@dataclass(frozen=True)
class CoreSplit:
    #: The cores vLLM bound the model workers to.
    engine: frozenset[int]
    #: The cores every other process of the stack now runs on.
    others: frozenset[int]

    def to_mapping(self) -> dict[str, list[int]]:
        return {"engine": sorted(self.engine), "others": sorted(self.others)}


def split_cores(worker_masks: Iterable[Iterable[int]], cpus: Iterable[int]) -> CoreSplit | None:
    """The workers' cores and the rest; None when no worker is bound (no core to
    protect) or the workers hold every core (nowhere else to go)."""
    engine = frozenset(c for mask in worker_masks for c in mask)
    others = frozenset(cpus) - engine
    if not engine or not others:
        return None
    return CoreSplit(engine, others)


def isolate_engine_cores() -> CoreSplit | None:
    """Move every thread of this process and its descendants, except the model
    workers', onto the cores no worker is bound to. Threads started later
    inherit their creator's cores."""
    me = psutil.Process()
    tree = [me, *me.children(recursive=True)]
    workers = [p for p in tree if _title(p).startswith(WORKER_TITLE)]
    split = split_cores((os.sched_getaffinity(t) for p in workers for t in _threads(p)), os.sched_getaffinity(0))
    if split is None:
        return None
    for process in tree:
        if process in workers:
            continue
        for thread in _threads(process):
            with contextlib.suppress(OSError):  # a thread that just ended
                os.sched_setaffinity(thread, split.others)
    return split


@contextlib.contextmanager
def engine_cores_isolated() -> Iterator[CoreSplit | None]:
    """``isolate_engine_cores`` for the duration; then this process gets back
    the cores it had, so that an engine started afterwards (which inherits
    them) binds its worker as if nothing had happened."""
    cores = os.sched_getaffinity(0)
    try:
        yield isolate_engine_cores()
    finally:
        for thread in _threads(psutil.Process()):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(thread, cores)


def process_role(title: str, cmdline: Sequence[str]) -> str:
    """What a process of a local stack is, for CPU accounting: ``worker`` (the
    model), ``engine_core`` (vLLM's scheduler loop, the Autellix plugin's
    included), ``api_server`` (vLLM's HTTP front), ``gateway``, or ``other``."""
    if title.startswith(WORKER_TITLE):
        return "worker"
    if title.startswith(ENGINE_CORE_TITLE):
        return "engine_core"
    if "vllm.entrypoints.openai.api_server" in cmdline:
        return "api_server"
    if "gateway" in cmdline:  # ``autellix gateway`` (``autellix.child_processes.gateway_process``)
        return "gateway"
    return "other"


def cpu_seconds_by_role() -> dict[str, float]:
    """CPU seconds (user and system) used so far by this process (``client``:
    in a benchmark, the load generator) and each of its descendants, summed by
    ``process_role``. Two of these taken around a run say where the CPU went;
    a process that starts or ends between them is counted from zero or not at all."""
    me = psutil.Process()
    totals: dict[str, float] = {}
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
            role = "client" if process.pid == me.pid else process_role(_title(process), process.cmdline())
        except psutil.Error:  # it ended meanwhile
            continue
        totals[role] = totals.get(role, 0.0) + times.user + times.system
    return totals


def cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds by role between two ``cpu_seconds_by_role``, rounded to 10 ms."""
    return {role: round(seconds - before.get(role, 0.0), 2) for role, seconds in sorted(after.items())}


def _title(process: psutil.Process) -> str:
    try:
        return process.name()
    except psutil.Error:  # it ended meanwhile
        return ""


def _threads(process: psutil.Process) -> list[int]:
    try:
        return [t.id for t in process.threads()]
    except psutil.Error:
        return []
