"""``autellix profile``: measure a running vLLM engine and fit its step cost.

The engine runs controlled batches: groups of concurrent streamed chat calls
with fixed prompt and output lengths (random, distinct prompt text, so nothing
is served from the prefix cache; ``ignore_eos``, so every call generates
exactly ``max_tokens``), sent through the OpenAI client as the benchmark sends
them. Each call's time to first token (from sending it: queueing and prefill
steps) and generation time (first to last token: decode steps) are measured.

Which steps those are, and what each step holds, is replayed through the
engine model with the same capacity (all requests of a group arrive together,
so the schedule does not depend on step times). Each measured time is then a
sum of steps, each linear in the cost model's terms, so one least-squares fit
over all of them gives the coefficients (``autellix.sim.cost_model``).

Times are taken where the benchmark takes them, at the client of a streamed
call, so they include what the API server adds to every step (detokenizing and
streaming each token) and, once per call, the way in and out (the profile's
``call_overhead``). Each group runs several times; the median per request
damps the noise of a shared machine.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autellix.sim.cost_model import Fit, StepCost, StepSample, fit_step_cost
from autellix.sim.engine_model import EngineModel
from autellix.sim.engine_profile import EngineProfile
from autellix.sim.engine_request import SimRequest


@dataclass(frozen=True)
class Group:
    """``concurrency`` requests sent at once, each ``prompt`` tokens in, ``output`` out."""

    concurrency: int
    prompt: int
    output: int
    #: Short calls (``foreground_prompt`` tokens in, one out) sent one after another
    #: while the group decodes: what admitting a call costs the steps around it.
    foreground: int = 0
    foreground_prompt: int = 0


#: Two long decodes with 0 to 32 short calls arriving meanwhile: the cost of a
#: call's admission (on a CPU engine, mostly the API server's handling of the
#: call on the cores the engine runs on), which the benchmark pays ~20 times a second.
INTERFERENCE = (Group(2, 64, 200), *(Group(2, 64, 200, foreground=k, foreground_prompt=300) for k in (8, 16, 32)))

#: Single requests over prompt lengths (prefill cost) and small groups over
#: context lengths (decode and KV cost): about a minute on the tiny CPU engine.
DEFAULT_GROUPS: tuple[Group, ...] = (
    Group(1, 16, 64), Group(1, 256, 32), Group(1, 1000, 32), Group(1, 2000, 24), Group(1, 4000, 16),
    Group(2, 64, 64), Group(3, 64, 64), Group(4, 64, 64), Group(4, 800, 34),
    Group(2, 1500, 32), Group(4, 1500, 32), Group(4, 3000, 16), Group(3, 2500, 24),
)

#: Characters of the random prompts (printable ASCII: one token each on the byte-level tokenizer).
TOKEN_RANGE = (32, 127)


@dataclass(frozen=True)
class Measured:
    group: Group
    repeat: int
    #: Per request: (time to first token, generation time) in seconds, at the client.
    times: tuple[tuple[float, float], ...]


def _prompt_text(length: int, rng: random.Random) -> str:
    return "".join(chr(rng.randint(*TOKEN_RANGE)) for _ in range(length))


async def _one(client: Any, model: str, text: str, output: int,
               started: asyncio.Event | None = None) -> tuple[float, float, int]:
    """One streamed chat call through the OpenAI client, as the benchmark makes it: (time to its
    first token, first to last token, prompt tokens), client side."""
    sent = time.monotonic()
    first = last = None
    prompt_tokens = 0
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=output, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if chunk.choices:
            last = time.monotonic()
            if first is None:
                first = last
                if started is not None:
                    started.set()
        if chunk.usage is not None:
            prompt_tokens = chunk.usage.prompt_tokens
    if first is None or last is None or not prompt_tokens:
        raise RuntimeError("the engine streamed no token or no usage")
    return first - sent, last - first, prompt_tokens


async def measure(target: str, groups: Sequence[Group], *, model: str, repeats: int, seed: int,
                  progress: Callable[[str], None] = print) -> list[Measured]:
    """Run every group ``repeats`` times; each group's prompt length becomes what the engine counted
    (the chat template adds its tokens to the content's)."""
    import openai

    rng = random.Random(f"profile:{seed}")
    out: list[Measured] = []
    client = openai.AsyncOpenAI(base_url=target.rstrip("/") + "/v1", api_key="none", max_retries=0, timeout=600)
    try:
        await _one(client, model, _prompt_text(8, rng), 4)  # warm-up, not measured
        window = 1.0
        for group in groups:
            for rep in range(repeats):
                started = time.monotonic()
                results, fg_prompt = await _run_group(client, model, group, rng, window)
                if not group.foreground:
                    window = statistics.median(r[1] for r in results)  # the next foreground spreads over this
                counted = Group(group.concurrency, results[0][2], group.output, group.foreground, fg_prompt)
                out.append(Measured(counted, rep, tuple((r[0], r[1]) for r in results)))
                progress(f"{group.concurrency} x ({counted.prompt} in, {group.output} out)"
                         + (f" + {group.foreground} calls of {fg_prompt} in" if group.foreground else "")
                         + f": {time.monotonic() - started:.2f} s")
    finally:
        await client.close()
    return out


async def _run_group(client: Any, model: str, group: Group, rng: random.Random,
                     window: float) -> tuple[list[tuple[float, float, int]], int]:
    """The group's calls at once and, once they stream, its foreground calls spread over ``window``."""
    decoding = asyncio.Event()
    texts = [_prompt_text(group.prompt, rng) for _ in range(group.concurrency)]
    background = [asyncio.ensure_future(_one(client, model, t, group.output, decoding)) for t in texts]
    foreground = []
    if group.foreground:
        await decoding.wait()
        for _ in range(group.foreground):
            await asyncio.sleep(0.8 * window / group.foreground)
            foreground.append(asyncio.ensure_future(
                _one(client, model, _prompt_text(group.foreground_prompt, rng), 1)))
    results = await asyncio.gather(*background)
    fg = await asyncio.gather(*foreground)
    return list(results), (fg[0][2] if fg else 0)


def replay(group: Group, profile: EngineProfile) -> list[tuple[StepSample, StepSample]]:
    """Per request of ``group``: the summed terms of the steps its time to first
    token spans (from the group's arrival to its first token, one call's way in
    included) and of those its generation time spans (the steps after, to its
    last token), as the engine model schedules the group."""
    unit = profile.with_overrides(cost=StepCost(1.0, 0.0, 0.0, 0.0, 0.0))
    engine = EngineModel(unit, scheduler="fcfs", prefix_caching=False)
    ids = [f"r{i}" for i in range(group.concurrency)]
    for i, rid in enumerate(ids):
        engine.add(SimRequest(rid, [i + 1] + [0] * (group.prompt - 1), group.output), 0.0)
    steps: list[tuple[float, float, float, float]] = []  # (prefill, decode, kv, admitted) of every step
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    now = 0.0
    while not engine.idle:
        result = engine.step(now)
        now += result.seconds
        index = len(steps)
        steps.append((float(result.prefill_tokens), float(result.decode_seqs), float(result.kv_tokens),
                      float(result.new_requests)))
        for rid in result.first_token:
            first[rid] = index
        for rid in result.finished:
            last[rid] = index

    def summed(lo: int, hi: int) -> StepSample:
        span = steps[lo:hi + 1]
        return StepSample(sum(s[0] for s in span), sum(s[1] for s in span), sum(s[2] for s in span),
                          seconds=0.0, steps=float(len(span)), new_requests=sum(s[3] for s in span))

    out = [(summed(0, first[r])._replace(calls=1.0), summed(first[r] + 1, last[r])) for r in ids]
    if group.foreground:
        # each short call is admitted, prefilled and done in one step inside the decode window
        k, p = group.foreground, group.foreground_prompt
        out = [(pre, dec._replace(prefill_tokens=dec.prefill_tokens + k * p, kv_tokens=dec.kv_tokens + k * p,
                                  new_requests=dec.new_requests + k)) for pre, dec in out]
    return out


def fit_profile(measured: Sequence[Measured], profile: EngineProfile) -> tuple[Fit, list[StepSample]]:
    """Fit the cost model to the median time of each request of each group over its repeats."""
    by_group: dict[Group, list[Measured]] = {}
    for m in measured:
        by_group.setdefault(m.group, []).append(m)
    samples: list[StepSample] = []
    for group, runs in by_group.items():
        terms = replay(group, profile)
        for i, (pre, dec) in enumerate(terms):
            samples.append(pre._replace(seconds=statistics.median(r.times[i][0] for r in runs)))
            if dec.steps > 0:
                samples.append(dec._replace(seconds=statistics.median(r.times[i][1] for r in runs)))
    return fit_step_cost(samples), samples


def engine_cache_config(target: str) -> dict[str, int]:
    """``block_size`` and ``num_gpu_blocks`` from the engine's ``vllm:cache_config_info`` metric."""
    import re
    import urllib.request

    with urllib.request.urlopen(target.rstrip("/") + "/metrics", timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            out = {}
            for key in ("block_size", "num_gpu_blocks"):
                value = labels.get(key, "")
                if value.isdigit():
                    out[key] = int(value)
            return out
    return {}


def build_profile(measured: Sequence[Measured], base: EngineProfile, *, engine: dict[str, Any]) -> dict[str, Any]:
    """The profile file's content: capacity, fitted cost, fit quality and the raw measurements."""
    fit, _ = fit_profile(measured, base)
    profile = base.with_overrides(cost=fit.cost, call_overhead=fit.call_overhead)
    return profile.to_dict() | {
        "description": "Fitted by `autellix profile` from client-side timings of controlled, streamed batches.",
        "fit": fit.quality() | {"method": "non-negative least squares of relative errors over per-call step sums "
                                          "(time to first token, generation time), medians over repeats"},
        "engine": engine,
        "measured": [{"concurrency": m.group.concurrency, "prompt": m.group.prompt, "output": m.group.output,
                      "foreground": m.group.foreground, "foreground_prompt": m.group.foreground_prompt,
                      "repeat": m.repeat, "ttft_s": [round(t[0], 5) for t in m.times],
                      "generation_s": [round(t[1], 5) for t in m.times]} for m in measured],
    }


def samples_from_steps(steps: Sequence[dict[str, float]], window: int = 32) -> list[StepSample]:
    """A step trace's steps (``autellix.engine.step_trace``) as fitting samples:
    each run of ``window`` consecutive steps summed into one (a single CPU step
    of a millisecond or two is mostly scheduler noise; their sums are not), cut
    where the engine went idle, since an idle gap is no step's."""
    from autellix.engine.step_trace import step_cycles

    samples: list[StepSample] = []
    chunk: list[tuple[dict[str, float], float]] = []

    def close() -> None:
        if chunk:
            samples.append(StepSample(
                prefill_tokens=sum(s["prefill_tokens"] for s, _ in chunk),
                decode_seqs=sum(s["decode_seqs"] for s, _ in chunk),
                kv_tokens=sum(s["kv_tokens"] for s, _ in chunk),
                seconds=sum(c for _, c in chunk), steps=float(len(chunk)),
                new_requests=sum(s["new_requests"] for s, _ in chunk)))
            chunk.clear()

    for step, cycle in zip(steps, step_cycles(list(steps)), strict=True):
        chunk.append((step, cycle))
        if step["idle"] or len(chunk) >= window:
            close()
    close()
    return samples


def profile_from_steps(traces: Sequence[Sequence[dict[str, float]]], base: EngineProfile, *,
                       window: int = 32) -> tuple[EngineProfile, Fit]:
    """``base`` with the step cost fitted to an engine's own steps under load
    (``autellix bench sweep --trace-steps``), rather than to client-side timings
    of controlled batches (``fit_profile``): the time between ``schedule()``
    calls is exactly what the simulator's step stands for. The way in and out
    of a call is not in any step, so ``base``'s ``call_overhead`` is kept."""
    samples = [s for steps in traces for s in samples_from_steps(steps, window)]
    fit = fit_step_cost(samples)
    return base.with_overrides(cost=fit.cost), fit
