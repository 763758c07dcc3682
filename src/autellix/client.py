"""A small client for agent programs: one session per program.

    from autellix.client import session
    with session("http://127.0.0.1:8000") as s:
        s.openai.chat.completions.create(model=..., messages=...)

The session is opened on entry and ended on exit, also when the body raises,
as the paper's frontend does. ``async_session`` is the same for asyncio. The
``openai`` client it gives back sends ``X-Autellix-Session`` on every call;
``thread=`` tags the calls of one thread (``X-Autellix-Thread``); ``parent=``
opens the session as a subagent of another (a session id: the gateway ranks
parent and subagents as one program); ``expected_tokens=`` declares the tokens
the program expects to generate in all (``docs/agents.md``, "Declaring a
program's size"). Session calls go through the same ``openai`` client, so its
auth, retries and proxies apply.

    with session(url) as lead, session(url, parent=lead.id) as helper:
        ...
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import openai

from autellix.protocol import EXPECTED_TOKENS_FIELD, SESSION_HEADER, SESSIONS_PATH, THREAD_HEADER, session_path


def _under_v1(path: str) -> str:
    """A gateway route relative to the ``openai`` client's /v1 base URL."""
    return path.removeprefix("/v1")


def _v1(base_url: str) -> str:
    """Accept either the server root or its /v1 URL."""
    base = base_url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


def session_headers(session_id: str, thread: str | None = None) -> dict[str, str]:
    return {SESSION_HEADER: session_id} | ({THREAD_HEADER: thread} if thread is not None else {})


@dataclass
class Session:
    id: str
    openai: Any


def _open_body(parent: str | None, expected_tokens: int | None) -> dict[str, str | int]:
    body: dict[str, str | int] = {"parent": parent} if parent is not None else {}
    if expected_tokens is not None:
        body[EXPECTED_TOKENS_FIELD] = expected_tokens
    return body


@contextmanager
def session(base_url: str, *, api_key: str | None = None, thread: str | None = None, parent: str | None = None,
            expected_tokens: int | None = None, **openai_kwargs: Any) -> Iterator[Session]:
    with openai.OpenAI(base_url=_v1(base_url), api_key=api_key or "none", **openai_kwargs) as bare:
        sid = bare.post(_under_v1(SESSIONS_PATH), body=_open_body(parent, expected_tokens), cast_to=object)["id"]
        try:
            yield Session(sid, bare.with_options(default_headers=session_headers(sid, thread)))
        finally:
            bare.delete(_under_v1(session_path(sid)), cast_to=object)


@asynccontextmanager
async def async_session(base_url: str, *, api_key: str | None = None, thread: str | None = None,
                        parent: str | None = None, expected_tokens: int | None = None,
                        **openai_kwargs: Any) -> AsyncIterator[Session]:
    async with openai.AsyncOpenAI(base_url=_v1(base_url), api_key=api_key or "none", **openai_kwargs) as bare:
        body = _open_body(parent, expected_tokens)
        sid = (await bare.post(_under_v1(SESSIONS_PATH), body=body, cast_to=object))["id"]
        try:
            yield Session(sid, bare.with_options(default_headers=session_headers(sid, thread)))
        finally:
            await bare.delete(_under_v1(session_path(sid)), cast_to=object)
