"""The engine profile: one engine's capacity and step cost on one kind of hardware, and its JSON files.

A profile is what the engine model (``autellix.sim.engine_model``) runs with:
KV blocks and their size, running slots, the step's token budget, the model's
context, the step cost (``autellix.sim.cost_model.StepCost``), each call's way
in, and KV retention's host memory and transfer cost. The bundled ones are
``autellix.sim.profiles/<name>.json``; ``autellix profile`` writes new ones.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from autellix.sim.cost_model import StepCost

PROFILE_PACKAGE = "autellix.sim.profiles"


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"engine profile {name}: expected an integer >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class EngineProfile:
    """Capacity and step cost of one engine on one kind of hardware."""

    name: str
    block_size: int
    kv_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    cost: StepCost
    max_model_len: int = 8192
    #: Seconds a call spends outside the engine's steps (HTTP, API server), on
    #: its way in; the simulator delays each call's arrival by this much.
    call_overhead: float = 0.0
    #: The Autellix schedulers hold a paused program's prefix until memory runs
    #: short (``autellix.core.kv_retention``); off, it is left to the LRU free
    #: list as stock vLLM leaves it (the stock schedulers never hold).
    kv_retention: bool = True
    #: Host memory for offloaded prefixes, in blocks (0: no swap path, prefixes are only dropped).
    host_kv_blocks: int = 0
    #: Seconds to move one block between device and host memory, each way
    #: (Llama-3.1-8B on an A100: 2 MiB a 16-token block, about 84 us at 25 GB/s over PCIe 4.0 x16).
    swap_s_per_block: float = 0.0
    #: Where the numbers come from (sources, fit quality, engine settings); not used by the model.
    provenance: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in ("block_size", "kv_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            _positive_int(name, getattr(self, name))
        if not isinstance(self.cost, StepCost):
            raise ValueError("engine profile cost: expected a StepCost")
        if not (isinstance(self.call_overhead, int | float) and 0 <= self.call_overhead < math.inf):
            raise ValueError(f"engine profile call_overhead: expected seconds >= 0, got {self.call_overhead!r}")
        if not isinstance(self.kv_retention, bool):
            raise ValueError(f"engine profile kv_retention: expected true or false, got {self.kv_retention!r}")
        if isinstance(self.host_kv_blocks, bool) or not isinstance(self.host_kv_blocks, int) or self.host_kv_blocks < 0:
            raise ValueError(f"engine profile host_kv_blocks: expected an integer >= 0, got {self.host_kv_blocks!r}")
        if not (isinstance(self.swap_s_per_block, int | float) and 0 <= self.swap_s_per_block < math.inf):
            raise ValueError(f"engine profile swap_s_per_block: expected seconds >= 0, got {self.swap_s_per_block!r}")

    def step_seconds(self, prefill_tokens: int, decode_seqs: int, kv_tokens: int, new_requests: int = 0) -> float:
        return self.cost.seconds(prefill_tokens, decode_seqs, kv_tokens, new_requests)

    @property
    def kv_tokens(self) -> int:
        return self.block_size * self.kv_blocks

    def with_overrides(self, **changes: Any) -> EngineProfile:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    # ---- files ------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineProfile:
        if not isinstance(data, dict):
            raise ValueError("engine profile: expected a JSON object")
        missing = [k for k in ("name", "block_size", "kv_blocks", "max_num_seqs", "max_num_batched_tokens", "cost")
                   if k not in data]
        if missing:
            raise ValueError(f"engine profile: missing {', '.join(missing)}")
        cost = data["cost"]
        if not isinstance(cost, dict):
            raise ValueError("engine profile cost: expected an object of coefficients")
        try:
            step_cost = StepCost(**{k: cost[k] for k in StepCost.__dataclass_fields__ if k in cost or
                                    StepCost.__dataclass_fields__[k].default is dataclasses.MISSING})
        except KeyError as exc:
            raise ValueError(f"engine profile cost: missing {exc.args[0]}") from None
        return cls(name=str(data["name"]), block_size=data["block_size"], kv_blocks=data["kv_blocks"],
                   max_num_seqs=data["max_num_seqs"], max_num_batched_tokens=data["max_num_batched_tokens"],
                   cost=step_cost, max_model_len=data.get("max_model_len", 8192),
                   call_overhead=data.get("call_overhead", 0.0), kv_retention=data.get("kv_retention", True),
                   host_kv_blocks=data.get("host_kv_blocks", 0), swap_s_per_block=data.get("swap_s_per_block", 0.0),
                   provenance={k: v for k, v in data.items() if k not in cls.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "provenance"}
        out["cost"] = self.cost.to_dict()
        return out | self.provenance

    @classmethod
    def load(cls, name_or_path: str | Path) -> EngineProfile:
        """A bundled profile by name (``profiles/<name>.json``) or a JSON file by path."""
        path = Path(name_or_path)
        if path.suffix == ".json" or path.exists():
            try:
                text = path.read_text()
            except OSError as exc:
                raise ValueError(f"engine profile {str(path)!r}: {exc.strerror}") from None
        else:
            resource = resources.files(PROFILE_PACKAGE) / f"{name_or_path}.json"
            if not resource.is_file():
                raise ValueError(f"unknown engine profile {str(name_or_path)!r}; "
                                 f"bundled: {', '.join(bundled_profiles())}")
            text = resource.read_text()
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ValueError(f"engine profile {str(name_or_path)!r}: not JSON ({exc})") from None


def bundled_profiles() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(PROFILE_PACKAGE).iterdir() if p.name.endswith(".json"))
