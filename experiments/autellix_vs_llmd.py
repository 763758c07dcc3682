"""Autellix against the llm-d rule (``llmd-fairness``) at the check's overloaded points.

    .venv/bin/python experiments/autellix_vs_llmd.py [docs/img/sim-check.json]

Reads a report of ``autellix sim sweep --figures check`` (it must have run
both systems) and prints, for every point where vllm-opt is overloaded (its
mean program token latency at least ``OVERLOAD`` x its own at the lowest rate,
same seed), how many times lower autellix's mean is than llm-d's: program
token latency (ms per token) and program latency (seconds), per seed and
their geometric mean over seeds. Then every point where autellix's mean is
more than ``TIE`` above llm-d's. No simulation: seconds.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

#: vllm-opt at this many times its unloaded latency counts as overloaded.
OVERLOAD = 3.0
#: Means within this share of each other are a tie.
TIE = 0.01
METRICS = (("mean_token_latency", "ms/token", 1e3), ("mean_program_seconds", "s", 1.0))


def overloaded(points: list[dict[str, Any]], point: dict[str, Any]) -> bool:
    lowest = min(p["rate"] for p in points)
    unloaded = next(p for p in points if p["rate"] == lowest and p["seed"] == point["seed"])
    base = unloaded["results"]["vllm-opt"]["mean_token_latency"]
    return point["results"]["vllm-opt"]["mean_token_latency"] >= OVERLOAD * base


def cuts(point: dict[str, Any], metric: str) -> float:
    """llm-d's mean over autellix's: how many times lower autellix's is."""
    return point["results"]["llmd-fairness"][metric] / point["results"]["autellix"][metric]


def main(path: Path) -> None:
    report = json.loads(path.read_text())
    worse: list[str] = []
    print("| slots | workload | rate | vllm-opt load | llm-d / autellix, ms per token (seeds; geomean) "
          "| llm-d / autellix, program seconds (seeds; geomean) |")
    print("|---|---|---|---|---|---|")
    for slots, by_workload in report["slots"].items():
        for workload, data in by_workload.items():
            points = data["points"]
            for rate in data["rates"]:
                at = [p for p in points if p["rate"] == rate]
                for p in at:
                    if cuts(p, "mean_token_latency") < 1.0 / (1.0 + TIE):
                        worse.append(f"{slots} slots {workload} {rate}/s seed {p['seed']}: autellix "
                                     f"{1 / cuts(p, 'mean_token_latency'):.3f}x llm-d's mean")
                if not all(overloaded(points, p) for p in at):
                    continue
                load = statistics.geometric_mean(
                    p["results"]["vllm-opt"]["mean_token_latency"]
                    / next(q for q in points if q["rate"] == min(data["rates"]) and q["seed"] == p["seed"])[
                        "results"]["vllm-opt"]["mean_token_latency"] for p in at)
                cells = []
                for metric, _, _ in METRICS:
                    values = [cuts(p, metric) for p in at]
                    cells.append(", ".join(f"{v:.2f}" for v in values)
                                 + f"; **{statistics.geometric_mean(values):.2f}x**")
                print(f"| {slots} | {workload} | {rate} | {load:.1f}x | {cells[0]} | {cells[1]} |")
    print(f"\nPoints where autellix's mean program token latency is more than {TIE:.0%} above llm-d's:")
    print("\n".join(f"* {line}" for line in worse) or "* none")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img/sim-check.json"))
