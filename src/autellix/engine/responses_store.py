"""Keeps an engine's Responses API store bounded: the newest ``AUTELLIX_RESPONSES_KEPT`` responses.

vLLM 0.32 stores each response of ``POST /v1/responses`` in memory when
``VLLM_ENABLE_RESPONSES_API_STORE=1`` (what ``previous_response_id`` and
``GET /v1/responses/{id}`` read), with the messages that produced it, and never
removes any: its own log warns of the leak. Engines that Autellix starts
(``autellix engine``, ``autellix up``, the operator, the chart) enable the store
and run this ASGI middleware in vLLM's API server (``--middleware``): after
each ``POST /v1/responses`` it drops the oldest responses, and their messages,
past the bound (default 10,000; a response of a short agent turn holds a few
KB, so about 100 MB at most on an engine that keeps long ones). A chain that
continues a response dropped here gets vLLM's own 404 through the gateway, as
for any response it does not know.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Mapping
from typing import Any

from autellix.protocol import RESPONSES_PATH

log = logging.getLogger(__name__)

#: Environment variable of the bound, and its default.
ENV_KEPT = "AUTELLIX_RESPONSES_KEPT"
DEFAULT_KEPT = 10_000


def kept_from(environ: Mapping[str, str]) -> int:
    raw = environ.get(ENV_KEPT, "")
    try:
        kept = int(raw) if raw.strip() else DEFAULT_KEPT
    except ValueError:
        kept = -1
    if kept < 1:
        raise ValueError(f"{ENV_KEPT} must be a whole number of responses >= 1, not {raw!r}")
    return kept


def trim(stores: list[dict[str, Any]], kept: int) -> int:
    """Drop the oldest entries of each store (dicts keep insertion order) past ``kept``; how many went."""
    dropped = 0
    for store in stores:
        for key in list(itertools.islice(store, max(0, len(store) - kept))):
            store.pop(key, None)
            dropped += 1
    return dropped


class ResponsesStoreBound:
    """ASGI middleware for vLLM's API server: the Responses API store trimmed after each response."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.kept = kept_from(os.environ)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == RESPONSES_PATH:
            try:
                serving = scope["app"].state.openai_serving_responses
            except (AttributeError, KeyError):  # a model without the Responses API: nothing stored
                return
            if serving is not None:
                trim([serving.response_store, serving.msg_store], self.kept)


__all__ = ["DEFAULT_KEPT", "ENV_KEPT", "ResponsesStoreBound", "kept_from", "trim"]
