"""vLLM as an engine backend (0.32, with or without Autellix's scheduler plugin).

* Annotation: the program's queue level as the request's ``priority`` (the
  engine runs ``--scheduling-policy priority`` or the plugin) and the program's
  fields as flat ``vllm_xargs`` (the plugin reads them as
  ``sampling_params.extra_args``); the client's own ``vllm_xargs`` are kept.
  Streams ask for ``stream_options.include_usage`` to learn the token counts.
* Load: ``vllm:num_requests_running`` + ``vllm:num_requests_waiting``.
* Model time, most exact first: the plugin's record of the call (the steps it
  ran in, ``autellix.protocol.CallRecord``); vLLM's per-request ``metrics``
  (``--enable-per-request-metrics``: first schedule to last token); generated
  tokens priced at the engine's seconds per token (Δ inference seconds / Δ
  generated tokens between scrapes).
* Drained: no running and no waiting request.
* A program's service on this engine (the plugin's tally, read when a gateway
  replica takes the program over): ``autellix.protocol.ProgramService``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autellix.backends.base import CallOutcome, EngineLoad
from autellix.backends.scrape import sample_labels
from autellix.protocol import (
    FEEDBACK_INFO_PATH,
    PRIORITY_FIELD,
    XARGS_FIELD,
    CallRecord,
    SchedulingFields,
    feedback_call_path,
    feedback_program_path,
)

RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
#: The KV cache: the share held by calls, and the cache's shape (an info metric: its labels say it).
KV_USAGE, CACHE_INFO = "vllm:kv_cache_usage_perc", "vllm:cache_config_info"
INFERENCE_SECONDS, GENERATION_TOKENS = "vllm:request_inference_time_seconds_sum", "vllm:generation_tokens_total"


class VllmBackend:
    name = "vllm"
    #: vLLM's ``/metrics`` runs to about 630 lines; these are all the pool reads (and ``CACHE_INFO``'s labels).
    pool_metrics = frozenset({RUNNING, WAITING, INFERENCE_SECONDS, GENERATION_TOKENS, KV_USAGE})

    def annotate(self, body: Mapping[str, Any], fields: SchedulingFields, *, stream: bool) -> dict[str, Any]:
        out = dict(body)
        ours = fields.xargs()
        theirs = body.get(XARGS_FIELD)
        out[XARGS_FIELD] = {**theirs, **ours} if isinstance(theirs, dict) else ours
        if fields.level is not None:
            # The queue level, not the raw service: discrete priorities (the paper's
            # point) and FCFS inside a level, which vLLM's (priority, arrival) gives.
            out[PRIORITY_FIELD] = fields.level
        if stream:
            out["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        return out

    def read_usage(self, answer: Mapping[str, Any], outcome: CallOutcome) -> None:
        usage = answer.get("usage") or {}
        outcome.completion_tokens = int(usage.get("completion_tokens") or 0)
        outcome.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        self.read_timing(answer, outcome)

    def read_timing(self, answer: Mapping[str, Any], outcome: CallOutcome) -> None:
        """vLLM's per-request ``metrics`` (``--enable-per-request-metrics``), on Chat, Completions and
        Responses answers (a Responses stream's: its final event's response)."""
        metrics = answer.get("metrics")
        if isinstance(metrics, dict):
            ttft, generation = metrics.get("time_to_first_token_ms"), metrics.get("generation_time_ms")
            if isinstance(ttft, int | float) and isinstance(generation, int | float):
                outcome.engine_seconds = max(0.0, (ttft + generation) / 1000.0)

    def load(self, metrics: Mapping[str, float]) -> EngineLoad:
        return EngineLoad(metrics.get(RUNNING, 0.0), metrics.get(WAITING, 0.0))

    def price_counters(self, metrics: Mapping[str, float]) -> tuple[float, float] | None:
        seconds, tokens = metrics.get(INFERENCE_SECONDS), metrics.get(GENERATION_TOKENS)
        return None if seconds is None or tokens is None else (seconds, tokens)

    def kv_blocks(self, metrics_text: str) -> tuple[int, int] | None:
        labels = sample_labels(metrics_text, CACHE_INFO)
        try:
            return (int(labels["num_gpu_blocks"]), int(labels["block_size"])) if labels else None
        except (KeyError, ValueError):
            return None

    def kv_usage(self, metrics: Mapping[str, float]) -> float | None:
        usage = metrics.get(KV_USAGE)
        return None if usage is None else min(1.0, max(0.0, usage))

    def drain_ready(self, metrics: Mapping[str, float]) -> bool:
        load = self.load(metrics)
        return load.running + load.waiting == 0

    def info_path(self) -> str | None:
        return FEEDBACK_INFO_PATH

    def record_path(self, call_id: str) -> str | None:
        return feedback_call_path(call_id)

    def program_path(self, program_id: str) -> str | None:
        return feedback_program_path(program_id)

    def model_time(self, record: CallRecord | None, outcome: CallOutcome,
                   seconds_per_token: float) -> tuple[float, str]:
        if record is not None:
            return record.service_s, "scheduler"
        if outcome.engine_seconds is not None:
            return outcome.engine_seconds, "vllm_metrics"
        return outcome.completion_tokens * seconds_per_token, "token_price"
