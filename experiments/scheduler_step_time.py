"""Time one scheduling step: Autellix's scheduler against vLLM's stock V1 scheduler.

Both run in this process on vLLM's real ``Scheduler`` class with fabricated model
output (``autellix_lab.harness``), so only scheduling is timed: 256 running
and 1,000 waiting requests, one ``schedule()`` plus ``update_from_output()`` per
step. The two are measured in alternating rounds in one run and reported as a
ratio per round, because this machine is shared and absolute times drift.

    .venv/bin/python experiments/scheduler_step_time.py [--rounds 7] [--steps 200] [--multi-step 1] \
        [--running 256 --waiting 1000]

Target: the plugin's step under 1.2x the stock step.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from typing import Annotated

import typer

RUNNING, WAITING = 256, 1000


def build(plugin: bool, programs: int, running: int = RUNNING, waiting: int = WAITING) -> object:
    from vllm.v1.core.sched.scheduler import Scheduler

    from autellix.engine.scheduler import AutellixScheduler
    from autellix_lab.harness import build_scheduler, make_request, step

    scheduler = build_scheduler(AutellixScheduler if plugin else Scheduler, max_num_seqs=running)
    for i in range(running + waiting):
        # the gateway's numbers: programs with a spread of attained service
        extra = {"autellix_program": f"p{i % programs}", "autellix_service": (i % programs) * 0.1,
                 "autellix_wait": 0.0, "autellix_call": f"c{i}"}
        scheduler.add_request(make_request(f"r{i}", 64, 100_000, priority=i % 5, extra_args=extra))
    while len(scheduler.running) < running:
        step(scheduler)
    return scheduler


def time_steps(scheduler: object, steps: int) -> float:
    """Mean seconds per step (schedule + update_from_output)."""
    from autellix_lab.harness import fake_output

    total = 0.0
    for _ in range(steps):
        start = time.perf_counter()
        out = scheduler.schedule()  # type: ignore[attr-defined]
        middle = time.perf_counter()
        result = fake_output(out, scheduler)  # the model's part: not timed
        resume = time.perf_counter()
        scheduler.update_from_output(out, result)  # type: ignore[attr-defined]
        total += (middle - start) + (time.perf_counter() - resume)
    return total / steps


def main(
    rounds: Annotated[int, typer.Option(min=1)] = 7,
    steps: Annotated[int, typer.Option(min=1)] = 200,
    multi_step: Annotated[int, typer.Option(min=1, help="Plugin re-plans every N steps")] = 1,
    programs: Annotated[int, typer.Option(min=1, help="Distinct programs among the requests")] = 200,
    running: Annotated[int, typer.Option(min=1, help="Running requests (max_num_seqs)")] = RUNNING,
    waiting: Annotated[int, typer.Option(min=0, help="Waiting requests")] = WAITING,
) -> None:
    os.environ["AUTELLIX_MULTI_STEP"] = str(multi_step)
    os.environ.pop("AUTELLIX_FEEDBACK_ADDR", None)
    stock, plugin = build(False, programs, running, waiting), build(True, programs, running, waiting)
    assert len(plugin.running) == running and len(plugin.waiting) == waiting  # type: ignore[attr-defined]
    gc.collect()
    ratios, stock_ms, plugin_ms = [], [], []
    for i in range(rounds):
        # alternate which goes first, so drift in the machine's speed cancels
        order = [(stock, stock_ms), (plugin, plugin_ms)]
        for scheduler, sink in order if i % 2 == 0 else order[::-1]:
            sink.append(time_steps(scheduler, steps) * 1e3)
        ratios.append(plugin_ms[-1] / stock_ms[-1])
    print(f"{running} running, {waiting} waiting, {programs} programs, multi-step {multi_step}, "
          f"{rounds} rounds x {steps} steps")
    print(f"stock vLLM scheduler : median {statistics.median(stock_ms):.3f} ms/step "
          f"(range {min(stock_ms):.3f}-{max(stock_ms):.3f})")
    print(f"Autellix scheduler   : median {statistics.median(plugin_ms):.3f} ms/step "
          f"(range {min(plugin_ms):.3f}-{max(plugin_ms):.3f})")
    print(f"ratio plugin/stock   : median {statistics.median(ratios):.2f}x "
          f"(per round {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    typer.run(main)
