"""When llm-d's flow control holds requests at the gateway: its default
saturation detector, ``utilization-detector``.

Written from its public description (the Gateway API Inference Extension's
``pkg/epp/saturationdetector/framework/plugins/utilizationdetector/README.md``,
which llm-d's router runs as its default saturation plugin), every number its
default: each engine scores ``max(waiting / 5, KV usage / 0.8)`` (a roofline:
the more constrained of its queue and its KV cache;
``queue_depth_threshold``, ``kv_util_threshold``), the pool's saturation is the
mean of its engines' scores, and requests are dispatched only while it is
below 1. The detector reads engine metrics refreshed every 50 ms and treats
metrics older than 200 ms as saturated; the simulator reads its engine models
directly, so there they are never stale (which favours the rival a little:
it never overshoots on an old reading).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autellix.core.engine_load import EngineLoad


@dataclass(frozen=True)
class UtilizationDetector:
    queue_depth_threshold: int = 5
    kv_util_threshold: float = 0.8

    def __post_init__(self) -> None:
        if self.queue_depth_threshold < 1:
            raise ValueError(f"queue_depth_threshold: expected >= 1, got {self.queue_depth_threshold}")
        if not 0.0 < self.kv_util_threshold <= 1.0:
            raise ValueError(f"kv_util_threshold: expected a fraction in (0, 1], got {self.kv_util_threshold}")

    def engine_score(self, load: EngineLoad) -> float:
        return max(load.waiting / self.queue_depth_threshold, load.kv_usage / self.kv_util_threshold)

    def saturation(self, loads: Sequence[EngineLoad]) -> float:
        """The pool's saturation: its engines' mean score (no engine: saturated)."""
        if not loads:
            return 1.0
        return sum(self.engine_score(load) for load in loads) / len(loads)

    def saturated(self, loads: Sequence[EngineLoad]) -> bool:
        return self.saturation(loads) >= 1.0


__all__ = ["UtilizationDetector"]
