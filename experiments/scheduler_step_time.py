"""Time one scheduling step: Autellix's scheduler against vLLM's stock V1 scheduler.

Both run in this process on vLLM's real ``Scheduler`` class with fabricated model
output (``autellix_lab.harness``), so only scheduling is timed: 256 running
and 1,000 waiting requests, one ``schedule()`` plus ``update_from_output()`` per
step. The two are measured in alternating rounds in one run and reported as a
ratio per round, because this machine is shared and absolute times drift. The KV
cache holds every request to the run's end (``kv_blocks_for``): when it runs out,
the stock scheduler preempts and shrinks its batch while the plugin keeps its
batch full, and their steps stop doing the same work.

    .venv/bin/python experiments/scheduler_step_time.py [--rounds 7] [--steps 200] [--multi-step 1] \
        [--running 256 --waiting 1000] [--no-skip-quiet-sweeps] [--parts] [--sweep-interval S]

Nothing arrives or leaves while the steps are timed, so the planner skips the sweeps that
would move no call (``CallPlanner.skip_quiet_sweeps``); ``--no-skip-quiet-sweeps`` runs every
due sweep, as an engine whose calls come and go between sweeps does. ``--parts`` also times
the parts of the plugin's step (each wrapped in a timer, which adds about a microsecond a part)
and prints them in ms per step, vLLM's own ``schedule()`` and ``update_from_output()`` inside the
plugin beside the stock scheduler's; it runs against any tree's ``src`` on ``PYTHONPATH``.

Target: the plugin's step at most 1.1x the stock step.
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Annotated, Any

import typer

RUNNING, WAITING = 256, 1000
PROMPT_TOKENS, BLOCK_SIZE = 64, 16
#: Steps before the timed rounds (the waiting requests' prefill until the batch is full), with room to spare.
WARMUP_STEPS = 16


def kv_blocks_for(running: int, waiting: int, steps: int, block_size: int = BLOCK_SIZE) -> int:
    """Blocks enough for every running request to decode ``steps`` more tokens and every waiting one to
    start: with fewer, the stock scheduler preempts and shrinks its batch when the KV cache runs out while
    the plugin keeps its batch full, and the two steps no longer do the same work."""
    per_running = math.ceil((PROMPT_TOKENS + steps) / block_size) + 1
    return math.ceil(1.1 * (running * per_running + waiting * (math.ceil(PROMPT_TOKENS / block_size) + 1)))


def build(plugin: bool, programs: int, running: int = RUNNING, waiting: int = WAITING,
          num_blocks: int = 20_000) -> object:
    from vllm.v1.core.sched.scheduler import Scheduler

    from autellix.engine.scheduler import AutellixScheduler
    from autellix_lab.harness import build_scheduler, make_request, step

    scheduler = build_scheduler(AutellixScheduler if plugin else Scheduler, max_num_seqs=running,
                                num_blocks=num_blocks, block_size=BLOCK_SIZE)
    for i in range(running + waiting):
        # the gateway's numbers: programs with a spread of attained service
        extra = {"autellix_program": f"p{i % programs}", "autellix_service": (i % programs) * 0.1,
                 "autellix_wait": 0.0, "autellix_call": f"c{i}"}
        scheduler.add_request(make_request(f"r{i}", PROMPT_TOKENS, 100_000, priority=i % 5, extra_args=extra))
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


class Parts:
    """Seconds spent in each part of the plugin's step (and in vLLM's, in both schedulers), and calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def timed(self, name: str | Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
        clock = time.perf_counter

        def run(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                key = name(*args, **kwargs) if callable(name) else name
                self.seconds[key] += clock() - start
                self.calls[key] += 1

        return run

    def install(self, stock: Any, plugin: Any) -> None:
        """Wrap the parts: the plugin's planning (sweeps, the quiet test, the preemption plan), marking the
        running calls and charging them; vLLM's ``schedule()`` and ``update_from_output()`` in both."""
        from vllm.v1.core.sched.scheduler import Scheduler

        import autellix.engine.planner as planner_module

        def who(scheduler: Any, *_: Any, **__: Any) -> str:
            return "plugin" if scheduler is plugin else "stock"

        for method in ("schedule", "update_from_output"):
            setattr(Scheduler, method, self.timed(lambda s, *a, m=method, **k: f"vLLM {m}() [{who(s)}]",
                                                  getattr(Scheduler, method)))
        queue = plugin.planner.queue
        queue.rebalance = self.timed(lambda now, *, sweep=True: "plan: sweep" if sweep else "plan: demotions only",
                                     queue.rebalance)
        if hasattr(queue, "quiet_until"):
            queue.quiet_until = self.timed("plan: quiet_until", queue.quiet_until)
        planner_module.preemption_victims = self.timed("plan: preemption plan", planner_module.preemption_victims)
        plugin._replan = self.timed("plan (all)", plugin._replan)
        plugin.planner.started = self.timed("mark running calls", plugin.planner.started)
        plugin.planner.step_done = self.timed("charge the step", plugin.planner.step_done)
        plugin.schedule = self.timed("plugin schedule() (all)", plugin.schedule)
        plugin.update_from_output = self.timed("plugin update_from_output() (all)", plugin.update_from_output)

    def report(self, steps: int) -> None:
        ms = {name: seconds / steps * 1e3 for name, seconds in self.seconds.items()}
        planned = ms["plan (all)"] - sum(v for k, v in ms.items() if k.startswith("plan: "))
        glue = (ms["plugin schedule() (all)"] - ms["plan (all)"] - ms["vLLM schedule() [plugin]"]
                - ms["mark running calls"])
        glue_update = ms["plugin update_from_output() (all)"] - ms["charge the step"] \
            - ms["vLLM update_from_output() [plugin]"]
        print(f"parts, ms per step over {steps} steps (calls):")
        for name in sorted(ms):
            if "(all)" not in name:
                print(f"  {name:40s} {ms[name]:7.3f}  ({self.calls[name]})")
        print(f"  {'plan: the rest (sort, running set)':40s} {planned:7.3f}")
        print(f"  {'rest of the plugin schedule()':40s} {glue:7.3f}")
        print(f"  {'rest of the plugin update_from_output()':40s} {glue_update:7.3f}")


def main(
    rounds: Annotated[int, typer.Option(min=1)] = 7,
    steps: Annotated[int, typer.Option(min=1)] = 200,
    multi_step: Annotated[int, typer.Option(min=1, help="Plugin re-plans every N steps")] = 1,
    programs: Annotated[int, typer.Option(min=1, help="Distinct programs among the requests")] = 200,
    running: Annotated[int, typer.Option(min=1, help="Running requests (max_num_seqs)")] = RUNNING,
    waiting: Annotated[int, typer.Option(min=0, help="Waiting requests")] = WAITING,
    skip_quiet_sweeps: Annotated[bool, typer.Option(
        help="Skip the sweeps that would move no call (off: every due sweep runs)")] = True,
    parts: Annotated[bool, typer.Option("--parts", help="Also time the parts of the plugin's step")] = False,
    sweep_interval: Annotated[float | None, typer.Option(
        min=0.0, help="Seconds between the plugin's sweeps, whatever the queue's length (default: the planner's, "
        "which grows with the queue; any other changes decisions)",
    )] = None,
) -> None:
    os.environ["AUTELLIX_MULTI_STEP"] = str(multi_step)
    os.environ.pop("AUTELLIX_FEEDBACK_ADDR", None)
    blocks = kv_blocks_for(running, waiting, rounds * steps + WARMUP_STEPS)
    stock, plugin = (build(False, programs, running, waiting, blocks),
                     build(True, programs, running, waiting, blocks))
    assert len(plugin.running) == running and len(plugin.waiting) == waiting  # type: ignore[attr-defined]
    planner = plugin.planner  # type: ignore[attr-defined]
    if hasattr(planner, "skip_quiet_sweeps"):
        planner.skip_quiet_sweeps = skip_quiet_sweeps
    if sweep_interval is not None:
        planner.sweep_interval, planner.sweep_interval_per_call = sweep_interval, 0.0
    timing = Parts() if parts else None
    if timing is not None:
        timing.install(stock, plugin)
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
    for name, scheduler in (("stock", stock), ("plugin", plugin)):
        batch = len(scheduler.running)  # type: ignore[attr-defined]
        if batch < running:
            print(f"warning: the {name} scheduler's batch fell to {batch} of {running} (its KV cache ran out): "
                  "the rounds are not comparable")
    if hasattr(planner, "skipped_sweeps"):
        print(f"plugin's sweeps      : {planner.sweeps} run, {planner.skipped_sweeps} skipped "
              f"(skip {'on' if planner.skip_quiet_sweeps else 'off'})")
    if timing is not None:
        timing.report(rounds * steps)


if __name__ == "__main__":
    typer.run(main)
