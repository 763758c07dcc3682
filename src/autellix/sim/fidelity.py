"""Simulated against measured: the benchmark's own sweep replayed in the simulator.

``autellix bench sweep`` writes, per system and rate, what the real engine
measured; this runs the same programs (same seeds) with the same Poisson
arrivals on the engine model and sets the two side by side.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autellix.core import SchedulerConfig
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.serving import sim_summary, simulate_programs
from autellix.workloads import make_programs
from autellix.workloads.systems import SYSTEMS

METRICS = ("mean_token_latency", "p99_token_latency", "programs_per_s", "mean_call_queue_s", "prefix_cache_hit_rate")


def compare(measured: dict[str, Any], profile: EngineProfile,
            systems: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One row per (system, rate) of a ``bench sweep`` report: measured and simulated metrics,
    and the simulated mean token latency's error relative to the measured one.

    The engine's running-call slots and the scheduler settings come from the
    report where it records them (``engine.max_num_seqs``, ``scheduler``)."""
    slots = (measured.get("engine") or {}).get("max_num_seqs")
    profile = profile.with_overrides(max_num_seqs=int(slots) if slots else None)
    config = SchedulerConfig.from_mapping(measured["scheduler"]) if measured.get("scheduler") else None
    rows = []
    for name in systems or list(measured["results"]):
        if name not in SYSTEMS:
            raise ValueError(f"system {name!r} of the report has no simulated counterpart")
        for i, rate in enumerate(measured["rates"]):
            real = measured["results"][name][str(rate)]
            count = int(measured["programs"][str(rate)])
            seed = int(measured["seed"]) + i  # as run_sweep seeds each rate
            programs = make_programs(measured["workload"], count, seed=seed,
                                     calibration=measured.get("calibration", "paper"))
            sim = sim_summary(simulate_programs(programs, profile=profile, system=name, rate=rate, seed=seed,
                                                config=config))
            rows.append({"system": name, "rate": rate, "programs": count,
                         "measured": {k: real.get(k) for k in METRICS},
                         "simulated": {k: sim.get(k) for k in METRICS},
                         "error": sim["mean_token_latency"] / real["mean_token_latency"] - 1})
    return rows


def compare_file(path: Path, profile: EngineProfile, systems: Sequence[str] | None = None) -> list[dict[str, Any]]:
    try:
        measured = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read the sweep report {str(path)!r}: {exc}") from None
    if not isinstance(measured, dict) or not {"workload", "rates", "results", "programs", "seed"} <= set(measured):
        raise ValueError(f"{str(path)!r} is not an `autellix bench sweep` report")
    return compare(measured, profile, systems)
