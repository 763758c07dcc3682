"""What the gateway knows of one engine's use and capacity: calls running and
waiting, running slots, KV blocks held and in all.

The gateway's engine pool fills it from each engine's metrics (vLLM:
``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc`` times ``num_gpu_blocks`` of
``vllm:cache_config_info``, and ``max_num_seqs`` from the engine's
configuration); the simulator from its engine models. Decisions that follow
the engines' capacity (``core.admission``, ``core.flow_control``) read it and
nothing else, so the gateway and the simulator decide alike.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineLoad:
    """One engine at one instant."""

    #: Calls in the running batch.
    running: int
    #: Calls queued in the engine, not yet scheduled.
    waiting: int
    #: Running slots (vLLM's ``max_num_seqs``).
    slots: int
    #: KV blocks held by calls (cached blocks that no call holds count as free, as in vLLM).
    kv_blocks_used: int
    kv_blocks_total: int
    #: Tokens per KV block (vLLM's ``block_size``).
    kv_block_size: int = 16

    def __post_init__(self) -> None:
        for name in ("running", "waiting", "kv_blocks_used"):
            if getattr(self, name) < 0:
                raise ValueError(f"engine load {name}: expected >= 0, got {getattr(self, name)}")
        for name in ("slots", "kv_blocks_total", "kv_block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine load {name}: expected >= 1, got {getattr(self, name)}")

    @property
    def kv_usage(self) -> float:
        """Share of the KV blocks held by calls (vLLM's ``kv_cache_usage_perc``)."""
        return min(1.0, self.kv_blocks_used / self.kv_blocks_total)

    @property
    def free_slots(self) -> int:
        return max(0, self.slots - self.running)


__all__ = ["EngineLoad"]
