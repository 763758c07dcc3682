"""ATLAS: attained service along a program's critical path, for DAG programs.

Each call inherits its program's value at arrival; on completion the program
keeps the longest path seen: ``max(service, inherited + model_time)``. Parallel
siblings do not add up (as they would under PLAS), so a wide program is not
pushed down for its width, and all its active calls share one priority.
"""

from __future__ import annotations

from autellix.core.config import SchedulerConfig
from autellix.core.mlq import QueueSpec


class ATLAS:
    name = "atlas"
    places_by_priority = True

    def attained_service(self, service: float, inherited: float, model_time: float) -> float:
        return max(service, inherited + model_time)

    def queues(self, config: SchedulerConfig) -> QueueSpec:
        return QueueSpec.from_config(config)
