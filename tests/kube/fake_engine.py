"""An engine stand-in on a local port: answers chat calls at once and reports, in vLLM's
metrics, whatever running/waiting load the test sets (the emulated load)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.live import serve_on_loopback

MODEL = "tiny-llama"


class FakeEngine:
    def __init__(self) -> None:
        self.running = 0.0
        self.waiting = 0.0
        self.calls = 0
        self.url = ""
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "vllm"}]})

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(text=f'vllm:num_requests_running{{model_name="{MODEL}"}} {self.running}\n'
                                 f'vllm:num_requests_waiting{{model_name="{MODEL}"}} {self.waiting}\n')

    async def _chat(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = await request.json()
        self.calls += 1
        tokens = int(body.get("max_tokens") or 4)
        return web.json_response({
            "id": f"chatcmpl-{self.calls}", "object": "chat.completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok " * tokens},
                         "finish_reason": "length"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": 5 + tokens}})

    async def start(self) -> FakeEngine:
        self.url = await serve_on_loopback(self._runner)
        self.port = int(self.url.rsplit(":", 1)[1])
        return self

    async def stop(self) -> None:
        await self._runner.cleanup()


def endpoint_slice(service: str, namespace: str, pod: str, port: int, *, ready: bool = True) -> dict[str, Any]:
    """The EndpointSlice the cluster keeps for one ready engine pod of ``service``."""
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": f"{service}-{pod}", "namespace": namespace,
                     "labels": {"kubernetes.io/service-name": service, "app.kubernetes.io/component": "engine",
                                "autellix.ai/engine": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": ready},
                       "targetRef": {"kind": "Pod", "name": pod, "namespace": namespace}}],
    }
