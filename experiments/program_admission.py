"""Program admission: where it holds programs, what that buys, and what it costs.

    nice -n 10 .venv/bin/python experiments/program_admission.py [--points check|sustained|all]

``check``: every point of the simulator's check (A100 profile, 32 and 256
slots, every workload, seeds 1-3, ``autellix.sim.sweep.CHECK_LOADS``) with
``autellix-no-admission`` and ``autellix`` (the same with ``core.admission``),
printing the points where admission held a program, with both systems' mean
and P99 program token latency, the programs held, the prefill tokens computed
and the programs finished per second. ``sustained``: tool-pause at 3
programs/s for 200 s of arrivals (600 programs, 32 slots) and 6/s for 100 s
(600 programs, 256 slots), beside llm-d's rule: overloads that outlast the
check's 60 s bursts, with more programs live than their contexts fit in the
KV cache. Deterministic (virtual time); the check part takes about an hour of
one core, the sustained part about ten minutes.
"""

from __future__ import annotations

import argparse

from autellix.core import SchedulerConfig
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.serving import sim_summary, simulate_programs
from autellix.sim.sweep import CHECK_LOADS, _run
from autellix.workloads import make_programs

SYSTEMS = ("autellix-no-admission", "autellix")
PROFILE = "a100-llama3.1-8b"


def line(label: str, summaries: dict[str, dict[str, float]]) -> str:
    ours, held = summaries["autellix-no-admission"], summaries["autellix"]
    return (f"| {label} | {1e3 * ours['mean_token_latency']:.1f} / {1e3 * ours['p99_token_latency']:.0f} "
            f"| {1e3 * held['mean_token_latency']:.1f} / {1e3 * held['p99_token_latency']:.0f} "
            f"| {held['mean_token_latency'] / ours['mean_token_latency']:.3f} "
            f"| {held['p99_token_latency'] / ours['p99_token_latency']:.3f} "
            f"| {held.get('admission_held_programs', 0)} "
            f"| {ours['prefill_tokens'] / 1e6:.2f}M / {held['prefill_tokens'] / 1e6:.2f}M "
            f"| {ours['programs_per_s']:.3f} / {held['programs_per_s']:.3f} |")


HEADER = ("| point | without admission: mean / P99 (ms/token) | with | mean ratio | P99 ratio | programs held "
          "| prefill tokens without / with | programs/s without / with |\n|---|---|---|---|---|---|---|---|")


def check_points() -> None:
    print(HEADER)
    engaged = 0
    for slots, loads in CHECK_LOADS.items():
        profile = EngineProfile.load(PROFILE).with_overrides(max_num_seqs=slots)
        for workload, load in loads.items():
            for index, rate in enumerate(load.rates):
                for seed in (1, 2, 3):
                    summaries = {s: _run(workload, load, rate, profile=profile, system=s, engines=1,
                                         config=SchedulerConfig(), seed=seed, index=index) for s in SYSTEMS}
                    if summaries["autellix"].get("admission_held_programs", 0):
                        engaged += 1
                        print(line(f"{slots} slots {workload} {rate}/s seed {seed}", summaries), flush=True)
    print(f"\nadmission held programs at {engaged} points; at every other point the two runs are the same")


def sustained() -> None:
    print(HEADER)
    rival = []
    for slots, rate, count in ((32, 3.0, 600), (256, 6.0, 600)):
        profile = EngineProfile.load(PROFILE).with_overrides(max_num_seqs=slots)
        for seed in (1, 2, 3):
            programs = make_programs("tool-pause", count, seed=seed)
            summaries = {s: sim_summary(simulate_programs(programs, profile=profile, system=s, rate=rate, seed=seed))
                         for s in (*SYSTEMS, "llmd-fairness")}
            label = f"tool-pause {rate}/s, {count} programs, {slots} slots, seed {seed}"
            print(line(label, summaries), flush=True)
            llmd = summaries["llmd-fairness"]
            rival.append(f"{label}: llmd-fairness {1e3 * llmd['mean_token_latency']:.1f} / "
                         f"{1e3 * llmd['p99_token_latency']:.0f} ms/token, {llmd['programs_per_s']:.3f} programs/s, "
                         f"{llmd['mean_token_latency'] / summaries['autellix']['mean_token_latency']:.2f}x "
                         "autellix's mean")
    print("\n".join(rival))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", choices=("check", "sustained", "all"), default="all")
    which = parser.parse_args().points
    if which in ("sustained", "all"):
        sustained()
    if which in ("check", "all"):
        check_points()


if __name__ == "__main__":
    main()
