"""The tiny interface every scheduling policy implements.

A policy answers three questions and nothing else:
* where does a new call enter the queues (by its program's priority, or always Q1)?
* how does a finished call change its program's attained service?
* which queue layout (boundaries, quanta, beta) does it run with?
The multi-level queue (``autellix.core.mlq``) and the process table do the rest,
so every policy, baselines included, runs through one code path.
"""

from __future__ import annotations

from typing import Protocol

from autellix.core.config import SchedulerConfig
from autellix.core.mlq import QueueSpec


class Policy(Protocol):
    #: Name used in configuration, metrics and reports.
    name: str
    #: True: a call enters the queue that holds its program's priority (Autellix).
    #: False: every call enters Q1 (classic MLFQ) or the only queue (FCFS).
    places_by_priority: bool

    def attained_service(self, service: float, inherited: float, model_time: float) -> float:
        """The program's service after one of its calls finished.

        ``service``: the program's value now; ``inherited``: the value the call
        took at arrival; ``model_time``: the call's execution time (no queueing).
        """
        ...

    def queues(self, config: SchedulerConfig) -> QueueSpec:
        """The queue layout this policy runs with under ``config``."""
        ...
