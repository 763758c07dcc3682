"""An upstream that answers at once: just enough of vLLM's OpenAI API for a gateway.

Used by ``experiments/gateway_overhead.py`` to measure what a gateway itself costs.
Run: ``python experiments/instant_engine.py --port 8100``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable

from aiohttp import web

MODEL = "tiny-llama"
USAGE = b'"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}'
CHAT = (b'{"id":"chatcmpl-0","object":"chat.completion","created":0,"model":"tiny-llama","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],' + USAGE + b"}")
COMPLETION = (b'{"id":"cmpl-0","object":"text_completion","created":0,"model":"tiny-llama","choices":[{"index":0,'
              b'"text":"ok","logprobs":null,"finish_reason":"stop"}],' + USAGE + b"}")
MODELS = b'{"object":"list","data":[{"id":"tiny-llama","object":"model","owned_by":"vllm"}]}'
METRICS = (f'vllm:num_requests_running{{model_name="{MODEL}"}} 0.0\n'
           f'vllm:num_requests_waiting{{model_name="{MODEL}"}} 0.0\n').encode()
JSON = "application/json"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def fixed(body: bytes, content_type: str = JSON, *, read_body: bool = False) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        if read_body:
            await request.read()
        return web.Response(body=body, content_type=content_type)
    return handler


@web.middleware
async def log_unknown(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPNotFound:
        print(f"instant_engine: unknown route {request.method} {request.path}", file=sys.stderr, flush=True)
        raise


def add_probes(app: web.Application) -> None:
    """What a gateway reads of an engine besides its calls: health, metrics and the models it serves."""
    app.router.add_get("/health", fixed(b"", "text/plain"))
    app.router.add_get("/metrics", fixed(METRICS, "text/plain"))
    app.router.add_get("/v1/models", fixed(MODELS))


def create_app() -> web.Application:
    app = web.Application(middlewares=[log_unknown])
    add_probes(app)
    app.router.add_post("/v1/chat/completions", fixed(CHAT, read_body=True))
    app.router.add_post("/v1/completions", fixed(COMPLETION, read_body=True))
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    args = parser.parse_args()
    web.run_app(create_app(), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
