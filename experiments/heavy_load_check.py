"""The real-engine check from ``autellix bench sweep`` reports: one row per draw.

The check (docs/results/2026-12-02-engine-check-3x-point.md): at the rate where bare vLLM is at about
3x its unloaded latency, autellix's mean program token latency at most
client-plas's and under half of vLLM's, over three draws. So that each draw costs
one engine start per system and not a sweep of every rate, only ``vllm`` also runs
the low reference rate: per draw, one sweep ``--systems vllm --rates LOW,X --seed S``
and one ``--systems vllm-opt,client-plas,autellix --rates X --seed S+1``. A sweep
draws the programs and arrivals of its i-th rate with seed ``seed + i``, so both
sweeps ran the same programs at X; this script checks that before it merges them.

    .venv/bin/python experiments/heavy_load_check.py DIR [DIR ...] [--merged-out FOLDER]

Each DIR holds one sweep's ``<workload>.json``. Reports are grouped by (workload,
the draw at the highest rate); each group prints one row: vLLM's load (its mean
at X over its mean at the lowest rate), every system's mean / P99 (ms per token)
and the two checked ratios. ``--merged-out`` writes each group as one report.
A summary, not a test: it runs nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

ORDER = ("vllm", "vllm-opt", "client-plas", "vllm-priority", "mlfq", "plas", "autellix")


def draws(report: dict[str, Any]) -> dict[str, int]:
    """Each rate's draw seed in this report (``run_sweep``: seed + the rate's index)."""
    return {str(rate): report["seed"] + i for i, rate in enumerate(report["rates"])}


def merge(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from sweeps of the same workload; a rate two reports share must be the same draw."""
    merged = {k: v for k, v in reports[0].items() if k not in ("results", "sustained", "under_load", "cores")}
    seeds: dict[str, int] = {}
    results: dict[str, dict[str, Any]] = {}
    for report in reports:
        if report["workload"] != merged["workload"]:
            raise ValueError(f"different workloads: {report['workload']} and {merged['workload']}")
        for rate, seed in draws(report).items():
            if seeds.setdefault(rate, seed) != seed:
                raise ValueError(f"rate {rate}: draws {seeds[rate]} and {seed} differ; use --seed S+1 "
                                 f"for the sweep without the low rate")
        for system, by_rate in report["results"].items():
            results.setdefault(system, {}).update(by_rate)
    rates = sorted({float(r) for r in seeds})
    merged.update(rates=rates, draws=seeds, results=results)
    return merged


def row(report: dict[str, Any]) -> dict[str, Any]:
    low, high = str(report["rates"][0]), str(report["rates"][-1])
    results = report["results"]
    out: dict[str, Any] = {"workload": report["workload"], "rate": float(high), "draw": report["draws"][high]}
    vllm = results.get("vllm", {})
    if low in vllm and high in vllm:
        out["vllm_load"] = vllm[high]["mean_token_latency"] / vllm[low]["mean_token_latency"]
    for system in sorted(results, key=lambda s: ORDER.index(s) if s in ORDER else len(ORDER)):
        if high in results[system]:
            s = results[system][high]
            out[system] = (1e3 * s["mean_token_latency"], 1e3 * s["p99_token_latency"])
    if "autellix" in out and "client-plas" in out:
        out["autellix/client-plas"] = out["autellix"][0] / out["client-plas"][0]
    if "autellix" in out and "vllm" in out:
        out["autellix/vllm"] = out["autellix"][0] / out["vllm"][0]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--merged-out", type=Path, default=None)
    args = parser.parse_args()
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for folder in args.dirs:
        for path in sorted(folder.glob("*.json")):
            report = json.loads(path.read_text())
            top = str(report["rates"][-1])
            groups.setdefault((report["workload"], draws(report)[top]), []).append(report)
    rows = []
    for (workload, draw), reports in sorted(groups.items()):
        merged = merge(reports)
        rows.append(row(merged))
        if args.merged_out:
            args.merged_out.mkdir(parents=True, exist_ok=True)
            (args.merged_out / f"{workload}-draw{draw}.json").write_text(json.dumps(merged, indent=2))
    for r in rows:
        systems = "  ".join(f"{s} {r[s][0]:.1f}/{r[s][1]:.1f}" for s in ORDER if s in r)
        load = f"vllm at {r['vllm_load']:.1f}x" if "vllm_load" in r else "no vllm reference"
        checks = "  ".join(f"{k} {r[k]:.2f}" for k in ("autellix/client-plas", "autellix/vllm") if k in r)
        print(f"{r['workload']} {r['rate']}/s draw {r['draw']} ({load}): {systems}  | {checks}")
    for workload in sorted({r["workload"] for r in rows}):
        for key in ("autellix/client-plas", "autellix/vllm"):
            values = [r[key] for r in rows if r["workload"] == workload and key in r]
            if values:
                print(f"{workload} {key}: mean {statistics.fmean(values):.2f}, "
                      f"range {min(values):.2f}-{max(values):.2f} over {len(values)} draws")


if __name__ == "__main__":
    main()
