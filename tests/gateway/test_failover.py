"""An engine dies while 50 programs run: every program still completes."""

from __future__ import annotations

import asyncio
import threading
import time

import openai

from autellix.child_processes import admin_url
from autellix.engine.launch import kill_engine
from autellix.gateway.views import engine_label
from tests.live import MODEL, engines, gateway, http


def test_killing_an_engine_loses_no_program(engine_logs) -> None:
    with engines(2, engine_logs) as pair, gateway([e.url for e in pair]) as base:
        deadline = time.monotonic() + 60  # /ready needs one engine; this test needs both in the pool
        while http("GET", base + "/ready")[1]["engines"] < 2:
            assert time.monotonic() < deadline, "second engine never joined the pool"
            time.sleep(0.2)

        async def program(i: int) -> tuple[int, int, list[str]]:
            sid = http("POST", f"{base}/v1/sessions")[1]["id"]
            client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0,
                                        default_headers={"X-Autellix-Session": sid})
            tokens = 0
            for turn in range(4):
                out = await client.chat.completions.create(
                    model=MODEL, max_tokens=64, extra_body={"ignore_eos": True},
                    messages=[{"role": "user", "content": f"program {i} turn {turn}"}])
                tokens += out.usage.completion_tokens
            await client.close()
            entry = http("GET", f"{admin_url(base)}/admin/sessions/{sid}")[1]  # the admin's view: engine URLs
            http("DELETE", f"{base}/v1/sessions/{sid}")
            return tokens, entry["calls_done"], entry["engines"]

        async def run_all() -> list[tuple[int, int, list[str]]]:
            return await asyncio.gather(*(program(i) for i in range(50)))

        def kill_when_busy() -> None:
            """Kill the second engine while it holds calls (gateway's in-flight gauge)."""
            needle = f'autellix_engine_inflight{{engine="{engine_label(pair[1].url)}"}} '
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                lines = http("GET", base + "/metrics")[1]["text"].splitlines()
                if any(ln.startswith(needle) and float(ln.split()[-1]) >= 3 for ln in lines):
                    break
                time.sleep(0.02)
            kill_engine(pair[1])

        killer = threading.Thread(target=kill_when_busy)
        killer.start()
        results = asyncio.run(run_all())
        killer.join()
        assert not pair[1].alive()
        assert [(tokens, calls) for tokens, calls, _ in results] == [(256, 4)] * 50
        # the engine that died had taken calls of running programs
        assert any(pair[1].url in engines for _, _, engines in results)
        status, ready = http("GET", base + "/ready")
        assert status == 200 and ready["engines"] == 1
        healthy = [e["url"] for e in http("GET", admin_url(base) + "/admin/engines")[1]["data"] if e["healthy"]]
        assert healthy == [pair[0].url]
