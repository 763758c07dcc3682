"""Program admission in the gateway over real engines: the pool reads each engine's KV cache from its
metrics, the admin listener shows the gate, and a finished program teaches it a working set."""

from __future__ import annotations

import time

from autellix.child_processes import admin_url
from autellix.engine.launch import TINY_KV_BLOCKS
from tests.live import MODEL, http


def test_the_gate_reads_the_engines_kv_cache_and_learns_from_finished_programs(gw: str) -> None:
    status, gate = http("GET", f"{admin_url(gw)}/admin/admission")
    assert status == 200 and gate["enabled"] is True
    assert [e["kv_blocks_total"] for e in gate["engines"]] == [TINY_KV_BLOCKS, TINY_KV_BLOCKS]
    before = gate["admitted"]
    status, opened = http("POST", f"{gw}/v1/sessions", {"priority": 3})
    assert status == 201
    assert http("GET", f"{admin_url(gw)}/admin/admission")[1]["admitted"] == before + 1
    status, _ = http("POST", f"{gw}/v1/chat/completions", {"model": MODEL, "max_tokens": 8, "ignore_eos": True,
                                                           "messages": [{"role": "user", "content": "x" * 200}]},
                     headers={"X-Autellix-Session": opened["id"]})
    assert status == 200
    assert http("DELETE", f"{gw}/v1/sessions/{opened['id']}")[0] == 200
    deadline = time.monotonic() + 5
    while (gate := http("GET", f"{admin_url(gw)}/admin/admission")[1])["working_set_tokens"] is None:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert gate["admitted"] == before and gate["working_set_tokens"] > 200 / 4  # prompt and reply tokens
    assert gate["program_limit"] >= 1
    status, body = http("POST", f"{gw}/v1/sessions", {"priority": "high"})
    assert status == 400 and body["error"]["param"] == "priority"
    status, body = http("POST", f"{gw}/v1/chat/completions", {"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "user", "content": "x"}]}, headers={"X-Autellix-Priority": "urgent"})
    assert status == 400 and body["error"]["param"] == "X-Autellix-Priority"
    metrics = http("GET", f"{gw}/metrics")[1]["text"]
    assert "autellix_programs_admitted" in metrics and "autellix_programs_refused_total" in metrics
