"""An engine dies while 50 programs run: every program still completes."""

from __future__ import annotations

import asyncio
import threading

import openai

from autellix.engine.launch import kill_engine
from tests.gateway.conftest import MODEL, engines, gateway, http


def test_killing_an_engine_loses_no_program(engine_logs) -> None:
    with engines(2, engine_logs) as pair, gateway([e.url for e in pair]) as base:

        async def program(i: int) -> tuple[int, int]:
            sid = http("POST", f"{base}/v1/sessions")[1]["id"]
            client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0,
                                        default_headers={"X-Autellix-Session": sid})
            tokens = 0
            for turn in range(4):
                out = await client.chat.completions.create(
                    model=MODEL, max_tokens=24, extra_body={"ignore_eos": True},
                    messages=[{"role": "user", "content": f"program {i} turn {turn}"}])
                tokens += out.usage.completion_tokens
            await client.close()
            entry = http("GET", f"{base}/v1/sessions/{sid}")[1]
            http("DELETE", f"{base}/v1/sessions/{sid}")
            return tokens, entry["calls_done"]

        async def run_all() -> list[tuple[int, int]]:
            return await asyncio.gather(*(program(i) for i in range(50)))

        killer = threading.Timer(1.5, kill_engine, args=[pair[1]])
        killer.start()
        results = asyncio.run(run_all())
        killer.join()
        assert not pair[1].alive()
        assert results == [(96, 4)] * 50
        status, ready = http("GET", base + "/ready")
        assert status == 200 and ready["engines"] == [pair[0].url]
        metrics = http("GET", base + "/metrics")[1]["text"]
        retries = next(ln for ln in metrics.splitlines() if ln.startswith("autellix_upstream_retries_total"))
        assert float(retries.split()[1]) >= 1  # the kill really hit calls in flight
