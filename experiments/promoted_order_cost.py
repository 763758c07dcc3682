"""What ordering the promoted calls costs a sweep of the multi-level queue, with and without it, in one process.

1,256 calls of 200 programs under the default layout (256 running), swept until most waiting calls are
promoted; then, alternating over repetitions, 30 sweeps with ``MultiLevelQueue._order_promoted`` replaced
by nothing and 30 with it (each stretch after three sweeps that absorb the other's catch-up). Every sweep
promotes a few more calls, so the order is redone at most sweeps: the heavy case.

Run: ``.venv/bin/python experiments/promoted_order_cost.py [--reps 15]``. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from autellix.core import MultiLevelQueue, ProgramView, QueueSpec, SchedulerConfig, mlq


def build(seed: int = 1) -> tuple[MultiLevelQueue, float]:
    rng = random.Random(seed)
    views = {}
    for i in range(200):
        service = rng.uniform(0, 30)
        views[f"p{i}"] = ProgramView(priority=service, wait=rng.uniform(0, 200), service=service)
    queue = MultiLevelQueue(QueueSpec.from_config(SchedulerConfig()), views.__getitem__)
    now = 0.0
    for i in range(1256):
        now += 0.001
        queue.add(i, f"p{rng.randrange(200)}", now)
    queue.mark_running(range(256))
    for _ in range(5):
        now += 1.0
        queue.ran(now)
        queue.rebalance(now)
    return queue, now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    queue, now = build()
    order = mlq.MultiLevelQueue._order_promoted

    def timed(on: bool, sweeps: int = 30) -> float:
        nonlocal now
        mlq.MultiLevelQueue._order_promoted = order if on else (lambda self, charged, moved: None)  # type: ignore
        for _ in range(3):
            now += 0.01
            queue.rebalance(now)
        began = time.perf_counter()
        for _ in range(sweeps):
            now += 0.01
            queue.rebalance(now)
        return (time.perf_counter() - began) / sweeps * 1e3

    ratios, without, with_order = [], [], []
    for _ in range(args.reps):
        without.append(timed(False))
        with_order.append(timed(True))
        ratios.append(with_order[-1] / without[-1])
    mlq.MultiLevelQueue._order_promoted = order
    promoted = sum(c.promoted and not c.running for c in queue)
    print(f"{promoted} promoted calls waiting of {len(queue)}; a sweep: {statistics.median(without):.2f} ms without "
          f"the order, {statistics.median(with_order):.2f} ms with it; with / without, median over {args.reps} "
          f"repetitions: {statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
