"""In a pod of another namespace: call the release's endpoint as a tenant's agent would, every API once.

Standard library only (it runs on the plain Debian base image). Environment: ``BASE_URL`` (the
endpoint, ending in /v1), ``API_KEY`` (a tenant key, from a Secret), ``MODEL``. Prints one JSON
object per check and exits non-zero when any check failed.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

BASE = os.environ["BASE_URL"].rstrip("/")
KEY = os.environ["API_KEY"]
MODEL = os.environ["MODEL"]


def call(path: str, body: dict[str, Any] | None, headers: dict[str, str], *, base: str = BASE,
         method: str = "POST") -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data, {"Content-Type": "application/json", **headers},
                                     method=method if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def bearer(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def models() -> str:
    status, body = call("/models", None, bearer())
    assert status == 200, (status, body[:300])
    ids = [m["id"] for m in json.loads(body)["data"]]
    assert MODEL in ids, ids
    return f"models: {ids}"


def chat() -> str:
    status, body = call("/chat/completions", {"model": MODEL, "max_tokens": 16,
                                             "messages": [{"role": "user", "content": "hello"}]}, bearer())
    assert status == 200, (status, body[:300])
    answer = json.loads(body)
    assert answer["object"] == "chat.completion", answer
    assert isinstance(answer["choices"][0]["message"]["content"], str), answer
    assert answer["usage"]["completion_tokens"] > 0, answer["usage"]
    return f"chat: {answer['usage']['completion_tokens']} tokens"


def chat_streamed() -> str:
    status, body = call("/chat/completions", {"model": MODEL, "max_tokens": 16, "stream": True,
                                             "stream_options": {"include_usage": True},
                                             "messages": [{"role": "user", "content": "hello"}]}, bearer())
    assert status == 200, (status, body[:300])
    events = [line[len("data: "):] for line in body.decode().splitlines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks), chunks[:2]
    text = "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c.get("choices"))
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert text and usage and usage[-1]["completion_tokens"] > 0, (text, usage)
    return f"chat streamed: {len(chunks)} chunks, {usage[-1]['completion_tokens']} tokens"


def responses() -> str:
    status, body = call("/responses", {"model": MODEL, "input": "hello", "max_output_tokens": 16}, bearer())
    assert status == 200, (status, body[:300])
    first = json.loads(body)
    # "incomplete" with reason max_output_tokens: the tiny model rarely ends a reply before the limit
    assert first["object"] == "response" and first["status"] in ("completed", "incomplete"), first
    assert first["status"] == "completed" or first["incomplete_details"]["reason"] == "max_output_tokens", first
    # The chain: a follow-up names the first response (one program in the gateway).
    status, body = call("/responses", {"model": MODEL, "input": "and then?", "max_output_tokens": 16,
                                       "previous_response_id": first["id"]}, bearer())
    assert status == 200, (status, body[:300])
    second = json.loads(body)
    texts = [c["text"] for item in second["output"] if item["type"] == "message" for c in item["content"]
             if c["type"] == "output_text"]
    assert texts, second
    return f"responses: {first['id']} -> {second['id']}"


def messages() -> str:
    root = BASE.removesuffix("/v1")
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    status, body = call("/v1/messages", {"model": MODEL, "max_tokens": 16,
                                         "messages": [{"role": "user", "content": "hello"}]}, headers, base=root)
    assert status == 200, (status, body[:300])
    answer = json.loads(body)
    assert answer["type"] == "message" and answer["role"] == "assistant", answer
    assert answer["content"][0]["type"] == "text" and answer["usage"]["output_tokens"] > 0, answer
    return f"messages: {answer['usage']['output_tokens']} tokens, stop {answer['stop_reason']}"


def wrong_key() -> str:
    status, body = call("/chat/completions", {"model": MODEL, "max_tokens": 4,
                                             "messages": [{"role": "user", "content": "hi"}]}, bearer("not-a-key"))
    assert status == 401, (status, body[:300])
    assert json.loads(body)["error"]["code"] == "invalid_api_key", body[:300]
    return "wrong key: 401 invalid_api_key"


CHECKS: list[Callable[[], str]] = [models, chat, chat_streamed, responses, messages, wrong_key]


def main() -> int:
    failed = 0
    for check in CHECKS:
        try:
            print(json.dumps({"check": check.__name__, "ok": True, "detail": check()}), flush=True)
        except Exception as exc:  # every check runs; the exit code says whether any failed
            failed += 1
            print(json.dumps({"check": check.__name__, "ok": False, "detail": repr(exc)[:1000]}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
