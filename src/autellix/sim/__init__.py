"""Simulators: the policy core driven by a model of an engine instead of a GPU."""

from __future__ import annotations

import math

from autellix.core import SchedulerConfig

#: The unit-step simulator counts service in steps, so its queues are split at
#: 1, 2, 4 and 8 steps with quanta of 1, 2, 4, 8 steps and an unbounded last
#: queue: the scale of the paper's toy figures (calls of 1 to 5 steps).
UNIT_STEP_CONFIG = SchedulerConfig(boundaries=(1.0, 2.0, 4.0, 8.0), quanta=(1.0, 2.0, 4.0, 8.0, math.inf))
