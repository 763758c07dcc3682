"""Which running calls an engine preempts so that the best-ranked calls run.

Algorithm 1 forms each batch afresh from the queues: the first calls in queue
order that fit. An engine keeps running calls between steps, so the batch it
should run differs from the one it runs only where a waiting call now outranks
a running one. Preempting exactly those running calls, worst-ranked first and
no more than the slots the waiting ones need, turns the queue order into the
engine's batch with the fewest context switches.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable
from itertools import islice

from autellix.core.mlq import QueuedCall


def preemption_victims(ordered: Iterable[QueuedCall], running: Collection[Hashable],
                       capacity: int) -> list[QueuedCall]:
    """Running calls to preempt, worst-ranked first.

    ``ordered``: every live call in queue order (``MultiLevelQueue`` iterates so);
    ``running``: ids of the calls the engine runs now; ``capacity``: how many
    calls a batch holds (vLLM's ``max_num_seqs``). The batch is the first
    ``capacity`` calls; each waiting call in it needs a slot, taken first from
    free slots, then from running calls outside the batch.
    """
    if capacity < 1:
        raise ValueError("capacity must be >= 1")
    calls = iter(ordered)
    batch = list(islice(calls, capacity))  # the rest is read only when someone must go
    waiting_in_batch = sum(1 for c in batch if c.call_id not in running)
    needed = waiting_in_batch - max(capacity - len(running), 0)
    if needed <= 0:
        return []
    outside = [c for c in calls if c.call_id in running]
    return outside[::-1][:needed]
