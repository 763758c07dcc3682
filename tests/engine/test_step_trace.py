"""The engine's step trace: what each batch held, checked against what the calls asked for."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from autellix.engine.launch import TRACED_SCHEDULER_CLS, stop_engine, wait_ready
from autellix.engine.step_trace import ENV_TRACE, batch_measures, read_trace, step_cycles, summarize_steps
from tests.live import chat, http, start_test_engine


def _step(t0: float, t3: float, idle: int, **measures: int) -> dict[str, float]:
    row = {"t0": t0, "t1": t0 + 0.001, "t2": t3 - 0.001, "t3": t3, "prefill_tokens": 0, "decode_seqs": 0,
           "kv_tokens": 0, "new_requests": 0, "cached_tokens": 0, "running": 1, "waiting": 0, "idle": idle}
    return row | measures


def test_a_step_lasts_until_the_next_unless_it_left_the_engine_idle() -> None:
    steps = [_step(0.0, 0.010, 0), _step(0.012, 0.020, 1), _step(5.0, 5.004, 0), _step(5.005, 5.009, 1)]
    # the gap after an idle step is the engine waiting for work, not part of a step
    assert step_cycles(steps) == pytest.approx([0.012, 0.020 - 0.012, 0.005, 0.004])
    summary = summarize_steps(steps)
    assert summary["steps"] == 4 and summary["busy_seconds"] == pytest.approx(0.029)
    assert summary["model_seconds"] == pytest.approx(0.008 + 0.006 + 0.002 + 0.002)  # schedule() to update


def test_a_batch_counts_prompt_chunks_as_prefill_and_single_last_tokens_as_decodes() -> None:
    requests = {
        # a prompt of 300, its first chunk of 200 just scheduled
        "a": SimpleNamespace(num_computed_tokens=200, num_tokens=300, num_output_tokens=0),
        # decoding: 300 prompt + 5 output, the newest token scheduled
        "b": SimpleNamespace(num_computed_tokens=305, num_tokens=305, num_output_tokens=5),
        # a prompt's last token (it has no output yet): prefill, not a decode
        "c": SimpleNamespace(num_computed_tokens=40, num_tokens=40, num_output_tokens=0),
    }
    assert batch_measures({"a": 200, "b": 1, "c": 1}, requests) == (201, 1, 200 + 305 + 40)


def test_a_stock_engine_traces_every_prompt_token_and_every_decode(tmp_path: Path) -> None:
    """Stock vLLM (FCFS) through ``TracedScheduler``, on the real engine: the
    trace must account for each call's prompt (prefilled or from the prefix
    cache) and each of its tokens after the first (one decode step each)."""
    trace = tmp_path / "steps.jsonl"
    engine = start_test_engine(tmp_path, scheduler="fcfs", max_num_seqs=2, extra_args=["--scheduler-cls",
                               TRACED_SCHEDULER_CLS], extra_env={ENV_TRACE: str(trace)})
    try:
        wait_ready([engine], timeout=400)
        long_prompt = "the same long question, word for word, " * 12  # > one 128-token KV block
        bodies = [chat(long_prompt, 24), chat("a short one", 16), chat(long_prompt, 20)]
        started = time.monotonic()
        with ThreadPoolExecutor(2) as pool:  # two at once, then the repeat of the first prompt
            first = list(pool.map(lambda b: http("POST", f"{engine.url}/v1/chat/completions", b), bodies[:2]))
        repeat = http("POST", f"{engine.url}/v1/chat/completions", bodies[2])
        answers = [*first, repeat]
        assert all(status == 200 for status, _ in answers), answers
        deadline = time.monotonic() + 5
        while not (steps := read_trace(trace, started)) or not steps[-1]["idle"]:
            assert time.monotonic() < deadline, "the trace was not written when the engine went idle"
            time.sleep(0.1)
    finally:
        stop_engine(engine)
    usage = [body["usage"] for _, body in answers]
    summary = summarize_steps(steps)
    assert summary["decode_seq_steps"] == sum(u["completion_tokens"] - 1 for u in usage) == 23 + 15 + 19
    assert summary["new_requests"] == 3
    # every prompt token was either computed in a step or served from the prefix cache
    assert summary["prefill_tokens"] + summary["cached_tokens"] == sum(u["prompt_tokens"] for u in usage)
    assert summary["cached_tokens"] >= 128  # the repeated prompt's first block at least
    assert max(s["running"] for s in steps) == 2  # the first two ran together
    assert 0 < summary["model_seconds"] < summary["busy_seconds"]
    assert all(c > 0 for c in step_cycles(steps))
