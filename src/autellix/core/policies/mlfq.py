"""Classic MLFQ baseline: every new call enters Q1, demotion by quanta.

No program-level statistics and no program-level anti-starvation: this is the
program-agnostic preemptive scheduler the paper compares against. Attained
service is still summed so the process table reports it.
"""

from __future__ import annotations

import math

from autellix.core.config import SchedulerConfig
from autellix.core.mlq import QueueSpec


class MLFQ:
    name = "mlfq"
    places_by_priority = False

    def attained_service(self, service: float, inherited: float, model_time: float) -> float:
        return service + model_time

    def queues(self, config: SchedulerConfig) -> QueueSpec:
        return QueueSpec(boundaries=config.boundaries, quanta=config.quanta, beta=math.inf)
