"""The paper's ATLAS against the width-aware rule, in the simulator.

    .venv/bin/python experiments/paper_atlas_vs_width_aware.py

Runs the check's wide points (A100 profile, ``autellix.sim.sweep.CHECK_LOADS``,
seeds 1-3) with the default policy and with the paper's rule (a program charged
only its critical path: ``max(service, inherited + model_time)``), everything
else the same, and prints mean and P99 program token latency (ms per token).
Numbers in docs/scheduling.md; about two minutes on one core.
"""

from __future__ import annotations

import autellix.core.policies as policies
from autellix.core import SchedulerConfig
from autellix.core.policies.atlas import ATLAS
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.sweep import CHECK_LOADS, _run

POINTS = ((32, "fanout", 1.0), (32, "fanout", 2.0), (32, "mixed", 1.2))


class PaperATLAS(ATLAS):
    """The paper's rule: parallel calls do not add up."""

    def attained_service(self, service: float, inherited: float, model_time: float) -> float:
        return max(service, inherited + model_time)


def main() -> None:
    for slots, workload, rate in POINTS:
        load = CHECK_LOADS[slots][workload]
        profile = EngineProfile.load("a100-llama3.1-8b").with_overrides(max_num_seqs=slots)
        for name, rule in (("width-aware", ATLAS), ("paper", PaperATLAS)):
            policies._BY_NAME["atlas"] = rule
            cells = []
            for seed in (1, 2, 3):
                summary = _run(workload, load, rate, profile=profile, system="autellix", engines=1,
                               config=SchedulerConfig(), seed=seed, index=load.rates.index(rate))
                cells.append(f"{1e3 * summary['mean_token_latency']:.1f}/{1e3 * summary['p99_token_latency']:.0f}")
            print(f"{workload} {rate}/s {slots} slots, ATLAS {name}: mean/P99 per seed {', '.join(cells)}")
        policies._BY_NAME["atlas"] = ATLAS


if __name__ == "__main__":
    main()
