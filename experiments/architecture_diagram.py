"""The README's picture: one call's path through Autellix, drawn with matplotlib.

    .venv/bin/python experiments/architecture_diagram.py [--out docs/img/architecture.png]

Agent programs send their calls, tagged with a program, through Envoy to a
gateway replica; the gateway ranks each call by its program's attained
service (process table, ATLAS or PLAS) and picks an engine (Algorithm 2); the
vLLM engine's scheduler plugin runs the preemptive multi-level queue and sends
each call's model time back into the process table. The operator shapes the
pool on Kubernetes. Deterministic: the same file every run (no date in it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img" / "architecture.png"

#: Fill and edge colours per kind of box.
CLIENT = ("#eef3fb", "#3b6fb6")
FRONT = ("#f4f4f4", "#6b6b6b")
GATEWAY = ("#fdf3e3", "#c07a12")
ENGINE = ("#e9f6ec", "#2e8b47")
CONTROL = ("#f3ecf8", "#7a4fa0")


def box(ax: plt.Axes, x: float, y: float, w: float, h: float, colours: tuple[str, str], title: str,
        lines: tuple[str, ...] | list[str] = (), *, size: float = 9.5, dashed: bool = False) -> None:
    """A rounded box at (x, y) (lower left), its title in bold at the top and ``lines`` under it."""
    fill, edge = colours
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.12", facecolor=fill,
                                edgecolor=edge, linewidth=1.4, linestyle="--" if dashed else "-"))
    ax.text(x + w / 2, y + h - 0.2, title, ha="center", va="top", fontsize=size + 0.5, fontweight="bold",
            color=edge)
    for i, line in enumerate(lines):
        ax.text(x + w / 2, y + h - 0.58 - i * 0.34, line, ha="center", va="top", fontsize=size, color="#222222")


def arrow(ax: plt.Axes, start: tuple[float, float], end: tuple[float, float], label: str = "", *,
          colour: str = "#333333", dashed: bool = False, offset: tuple[float, float] = (0, 0.16),
          rad: float = 0.0, both: bool = False) -> None:
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="<|-|>" if both else "-|>", mutation_scale=14,
                                 linewidth=1.4, color=colour, linestyle="--" if dashed else "-",
                                 connectionstyle=f"arc3,rad={rad}"))
    if label:
        mid = ((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1])
        ax.text(*mid, label, ha="center", va="bottom", fontsize=8.5, color=colour, style="italic")


def draw(out: Path) -> None:
    fig, ax = plt.subplots(figsize=(13, 7.0))
    ax.set_xlim(0, 13)
    ax.set_ylim(0, 7.0)
    ax.axis("off")

    box(ax, 0.1, 2.3, 2.5, 3.0, CLIENT, "agent programs",
        ["chat, ReAct tool loop,", "coding agent + subagents,", "tree search", "",
         "OpenAI Chat / Responses,", "Anthropic Messages;", "one program id a session"])
    box(ax, 3.1, 3.2, 1.5, 1.2, FRONT, "Envoy", ["ring hash on", "the program key"], size=8.5)
    box(ax, 5.1, 1.9, 3.7, 4.3, GATEWAY, "gateway replicas",
        ["process table: each program's", "attained service and wait", "",
         "priority of a call = its program's", "service (ATLAS, PLAS)", "",
         "program admission under overload", "",
         "Algorithm 2: short calls to the least", "used engine, long ones to the", "program's engine (its KV cache)"])
    box(ax, 5.5, 0.15, 2.9, 1.1, FRONT, "program store", ["Valkey, shared by replicas"], size=8.5)
    for i, dy in enumerate((0.3, 0.15, 0.0)):
        title, lines = ("", []) if i < 2 else ("vLLM engines", [
            "Autellix's scheduler plugin:", "multi-level queue by priority,", "anti-starvation (beta, backlog),",
            "cost-aware preemption", "", "KV swap to host memory,", "prefixes kept across tool pauses"])
        box(ax, 9.4 + dy, 1.9 + dy, 3.3, 4.0, ENGINE, title, lines)
    box(ax, 9.4, 0.15, 3.3, 1.1, CONTROL, "operator (Kubernetes)", ["engine pods, autoscaling, drains"], size=8.5)

    arrow(ax, (2.65, 3.8), (3.05, 3.8))
    arrow(ax, (4.65, 3.8), (5.05, 3.8), "call +", offset=(0, 0.12))
    ax.text(4.85, 3.62, "program", ha="center", va="top", fontsize=8.5, style="italic", color="#333333")
    arrow(ax, (8.85, 4.5), (9.35, 4.5), "call +", offset=(0, 0.12))
    ax.text(9.1, 4.32, "priority", ha="center", va="top", fontsize=8.5, style="italic", color="#333333")
    arrow(ax, (9.35, 3.0), (8.85, 3.0), "model", colour=ENGINE[1], dashed=True, offset=(0, 0.12))
    ax.text(9.1, 2.82, "time", ha="center", va="top", fontsize=8.5, style="italic", color=ENGINE[1])
    arrow(ax, (6.95, 1.3), (6.95, 1.85), colour=FRONT[1], dashed=True, both=True)
    arrow(ax, (11.05, 1.3), (11.05, 1.85), colour=CONTROL[1], dashed=True)
    ax.text(6.5, 6.95, "One call's path: the program's rank is decided once, in the policy core, "
            "which the gateway, the engine plugin and the simulator share", ha="center", va="top", fontsize=10,
            color="#444444")
    fig.savefig(out, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"the PNG to write (default {OUT.relative_to(ROOT)})")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    draw(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
