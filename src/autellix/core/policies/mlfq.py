"""Classic MLFQ baseline: every new call enters Q1, demotion by quanta.

No program-level statistics and no program-level anti-starvation: this is the
program-agnostic preemptive scheduler the paper compares against. Attained
service is still summed so the process table reports it.
"""

from __future__ import annotations

import math

from autellix.core.config import SchedulerConfig
from autellix.core.mlq import QueueSpec

#: Steps in Q1 of classic MLFQ when the configuration leaves quanta unbounded.
CLASSIC_FIRST_QUANTUM = 64


class MLFQ:
    name = "mlfq"
    places_by_priority = False

    def attained_service(self, service: float, inherited: float, model_time: float) -> float:
        return service + model_time

    def queues(self, config: SchedulerConfig) -> QueueSpec:
        quanta = config.quanta
        if all(math.isinf(q) for q in quanta):
            # Classic MLFQ is demotion by quanta; without any it would be FCFS. With
            # the default unbounded quanta it takes doubling ones from 64 steps.
            quanta = (*(float(CLASSIC_FIRST_QUANTUM * 2**i) for i in range(len(quanta) - 1)), math.inf)
        return QueueSpec(boundaries=config.boundaries, quanta=quanta, beta=math.inf)
