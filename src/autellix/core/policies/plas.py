"""PLAS: program-level attained service, for single-threaded programs.

A call's priority is the sum of the execution times of its program's completed
calls (least attained service first), so short programs overtake long ones.
"""

from __future__ import annotations

from autellix.core.config import SchedulerConfig
from autellix.core.mlq import QueueSpec


class PLAS:
    name = "plas"
    places_by_priority = True

    def attained_service(self, service: float, inherited: float, model_time: float) -> float:
        return service + model_time

    def queues(self, config: SchedulerConfig) -> QueueSpec:
        return QueueSpec.from_config(config)
