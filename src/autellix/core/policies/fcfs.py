"""FCFS baseline: one queue, no quantum, no promotion (vLLM's default order)."""

from __future__ import annotations

import math

from autellix.core.config import SchedulerConfig
from autellix.core.mlq import QueueSpec


class FCFS:
    name = "fcfs"
    places_by_priority = False

    def attained_service(self, service: float, inherited: float, model_time: float) -> float:
        return service + model_time

    def queues(self, config: SchedulerConfig) -> QueueSpec:
        return QueueSpec(boundaries=(), quanta=(math.inf,), beta=math.inf)
