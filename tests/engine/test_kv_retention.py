"""KV retention inside vLLM's real V1 ``Scheduler`` (``autellix_lab.harness``, fabricated model output):
a paused program's prefix is pinned in vLLM's block pool, survives the churn that LRU would evict it in,
and yields to any allocation that needs its blocks. Seconds, no server."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

pytest.importorskip("vllm")

from autellix.engine.feedback import ENV_ADDR, FeedbackStore
from autellix.engine.kv.retention import ENV_RETENTION, NoHostSwap, RetainingKVCacheManager
from autellix.engine.scheduler import AutellixScheduler
from autellix.protocol import XARG_EXPECT_RETURN, XARG_PROGRAM
from autellix_lab.harness import SAMPLED_TOKEN_ID, build_scheduler, make_request, step

BLOCK = 16


@pytest.fixture(autouse=True)
def quiet_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("AUTELLIX_POLICY", "AUTELLIX_BETA", "AUTELLIX_MULTI_STEP", ENV_RETENTION, ENV_ADDR):
        monkeypatch.delenv(name, raising=False)
    yield


def drain(scheduler: AutellixScheduler, limit: int = 2000) -> list[str]:
    """Step until nothing is left; returns the ids preempted on the way."""
    preempted: list[str] = []
    for _ in range(limit):
        if not (scheduler.running or scheduler.waiting):
            return preempted
        out, _ = step(scheduler)
        preempted += sorted(out.preempted_req_ids or ())
    raise AssertionError("the scheduler did not drain")


def prompt(seed: int, length: int) -> list[int]:
    return list(make_request(f"seed{seed}", length, 1).prompt_token_ids)


class Program:
    """A program whose every call sends its last prompt, the reply and 32 new tokens."""

    def __init__(self, scheduler: AutellixScheduler, name: str, *, offers_tools: bool = False) -> None:
        self.s, self.name = scheduler, name
        self.prompt = prompt(hash(name) % 1000, 96)
        self.turn = 0
        self.xargs: dict[str, object] = {XARG_PROGRAM: name} | ({XARG_EXPECT_RETURN: True} if offers_tools else {})

    def call(self, max_tokens: int = 8) -> None:
        request = make_request(f"{self.name}.{self.turn}", 0, max_tokens, prompt_token_ids=list(self.prompt),
                               extra_args=dict(self.xargs))
        self.s.add_request(request)
        drain(self.s)
        self.prompt = self.prompt + [SAMPLED_TOKEN_ID] * max_tokens + prompt(2000 + self.turn, 32)
        self.turn += 1


def churn(scheduler: AutellixScheduler, count: int, length: int) -> list[str]:
    """One-call programs, one after the other: they cycle vLLM's LRU free list."""
    preempted = []
    for i in range(count):
        scheduler.add_request(make_request(f"other.{i}", length, 4, extra_args={"autellix_program": f"other.{i}"}))
        preempted += drain(scheduler)
    return preempted


def scheduler(num_blocks: int = 40) -> AutellixScheduler:
    s = build_scheduler(AutellixScheduler, num_blocks=num_blocks, block_size=BLOCK, max_num_seqs=2,
                        max_num_batched_tokens=128, max_model_len=1024)
    assert isinstance(s, AutellixScheduler)
    return s


@pytest.mark.parametrize("retention", ["on", "off"])
def test_a_paused_programs_prefix_survives_churn_only_when_held(monkeypatch: pytest.MonkeyPatch,
                                                                  retention: str) -> None:
    monkeypatch.setenv(ENV_RETENTION, retention)
    s = scheduler()
    assert isinstance(s.host_swap, NoHostSwap)  # no connector loaded
    assert isinstance(s.kv_cache_manager, RetainingKVCacheManager) == (retention == "on")
    p = Program(s, "p")
    p.call()
    p.call()  # it came back once: from now on its pauses are held
    held = s.retention.ledger.held("p")
    pool = s.kv_cache_manager.block_pool
    if retention == "on":
        # the full blocks of what it computed (its last sampled token never went through the model)
        assert len(held) == (96 + 8 + 32 + 8 - 1) // BLOCK and all(b.ref_cnt == 1 for b in held)
        assert pool.get_num_free_blocks() == 40 - 1 - len(held)  # the null block, the hold
    else:
        assert held == () and pool.get_num_free_blocks() == 39
    assert churn(s, 6, 200) == []
    p.call()
    stats = s.retention.stats()
    if retention == "on":
        assert stats["recomputed_prefix_blocks"] == 0 and stats["resumed_holds"] == 1
    else:
        assert stats["recomputed_prefix_blocks"] >= 5  # LRU gave its blocks to the churn
    assert stats["reused_prefix_blocks"] + stats["recomputed_prefix_blocks"] >= 2 * 6


def test_a_held_prefix_yields_to_a_call_that_needs_its_blocks() -> None:
    s = scheduler()
    p = Program(s, "p")
    p.call()
    p.call()
    assert s.retention.ledger.held_blocks == 8
    # 36 of the 39 usable blocks: admitted at once, nothing preempted, the hold dropped
    s.add_request(make_request("big", 560, 4, extra_args={"autellix_program": "big"}))
    out, _ = step(s)
    assert "big" in out.num_scheduled_tokens
    assert drain(s) == [] and not out.preempted_req_ids
    stats = s.retention.stats()
    assert stats["dropped"] == 1 and stats["held_blocks"] == 0
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == 39


def test_resetting_the_prefix_cache_releases_the_holds() -> None:
    s = scheduler()
    p = Program(s, "p")
    p.call()
    p.call()
    assert s.retention.ledger.held_blocks > 0
    assert s.reset_prefix_cache()
    assert s.retention.ledger.held_blocks == 0 and s.kv_cache_manager.block_pool.get_num_free_blocks() == 39


def test_requests_of_no_program_are_never_held() -> None:
    s = scheduler()
    for turn in range(3):
        s.add_request(make_request(f"anon.{turn}", 100, 4))
        drain(s)
    assert s.retention.ledger.held_blocks == 0 and s.kv_cache_manager.block_pool.get_num_free_blocks() == 39


def test_a_call_that_offers_tools_has_its_prefix_held_from_the_first_pause() -> None:
    s = scheduler()
    Program(s, "agent", offers_tools=True).call()
    Program(s, "chat").call()
    assert len(s.retention.ledger.held("agent")) == (96 + 8 - 1) // BLOCK
    assert s.retention.ledger.held("chat") == ()


def test_a_sessions_end_from_the_api_server_releases_the_hold(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_ADDR, f"ipc://{tmp_path}/fb.sock")
    s = scheduler()
    assert s.program_ends is not None
    api_server = FeedbackStore(f"ipc://{tmp_path}/fb.sock")  # the middleware's side
    p = Program(s, "p")
    p.call()
    p.call()
    assert s.retention.ledger.held_blocks == 8
    assert api_server.end("p")
    deadline = time.monotonic() + 5
    while s.retention.ledger.held_blocks and time.monotonic() < deadline:
        step(s)  # an idle step still reads the ends that came in
        time.sleep(0.01)
    assert s.retention.ledger.held_blocks == 0 and "p" not in s.retention.ledger.predictor
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == 39
