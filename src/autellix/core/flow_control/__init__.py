"""Gateway-side flow control as llm-d's router does it (the rival, written from
its public description): requests wait at the gateway in per-program queues
while the pool is saturated (``saturation``), and the dispatcher takes the
next one from the program with the best program-aware fairness score
(``program_fairness``). Pure: time and engine loads are arguments.
"""

from __future__ import annotations

from autellix.core.flow_control.program_fairness import FairnessParams, ProgramFairQueues
from autellix.core.flow_control.saturation import UtilizationDetector

__all__ = ["FairnessParams", "ProgramFairQueues", "UtilizationDetector"]
