"""What the KV event index costs a gateway replica: applying the engines' events, and hashing a prompt.

    .venv/bin/python experiments/kv_index_cost.py [--batches 2000] [--calls 200]

* Events: batches as vLLM's publisher encodes them (msgpack, ``KVEventBatch``), each one engine step's
  prefill of 512 tokens (32 blocks of 16 stored) and as many blocks evicted, decoded and applied to a
  ``PrefixIndex`` by the feed's own code: microseconds per block event. Every replica follows every
  engine, so this is what each replica pays for the engines' whole event stream.
* Prompts: a Chat Completions call of about 7,000 tokens rendered with the tiny model's chat template and
  tokenized (``ChatPrompt.tokens``), then hashed as vLLM hashes it at block sizes 128 (the CPU engines')
  and 16 (vLLM's GPU default): milliseconds per call, paid only by calls whose routing weighs the index.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import msgspec
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

from autellix.core import PrefixIndex, VllmBlockHasher
from autellix.engine.tiny_model import build_tiny_model, default_model_dir
from autellix.gateway.kv_events import _events, apply_batch
from autellix.gateway.prompt_blocks import ChatPrompt

BLOCKS_PER_STEP, BLOCK = 32, 16


def event_cost(batches: int, rng: random.Random) -> float:
    encode = msgspec.msgpack.Encoder().encode
    payloads = []
    for _ in range(batches):
        hashes = [rng.getrandbits(64) for _ in range(BLOCKS_PER_STEP)]
        payloads.append(encode(KVEventBatch(ts=time.time(), events=[
            BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=list(range(BLOCK * len(hashes))),
                        block_size=BLOCK, lora_id=None, medium="GPU", lora_name=None),
            BlockRemoved(block_hashes=hashes, medium="GPU")])))
    decode, index = msgspec.msgpack.Decoder().decode, PrefixIndex()
    start = time.perf_counter()
    for payload in payloads:
        apply_batch(index, "engine", _events(decode(payload)))
    return (time.perf_counter() - start) / (batches * 2 * BLOCKS_PER_STEP)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(1)
    events = [event_cost(args.batches, rng) * 1e6 for _ in range(args.rounds)]
    print(f"events: {statistics.median(events):.2f} us per block event (decode + apply; "
          f"{min(events):.2f}-{max(events):.2f} over {args.rounds} rounds)")
    prompt = ChatPrompt.from_model_dir(build_tiny_model(default_model_dir()))
    assert prompt is not None
    body = {"messages": [{"role": "system", "content": "You are a helpful agent with tools. " * 180},
                         {"role": "user", "content": "question " * 50}]}
    tokens = prompt.tokens(body) or []
    hashers = {size: VllmBlockHasher(size) for size in (128, 16)}
    works = [("render + tokenize", lambda: prompt.tokens(body)),
             *[(f"hash, block {size}", lambda h=hasher: h.chain(tokens)) for size, hasher in hashers.items()]]
    for name, work in works:
        rounds = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            for _ in range(args.calls):
                work()
            rounds.append((time.perf_counter() - start) / args.calls * 1e3)
        print(f"{name} ({len(tokens)} tokens): {statistics.median(rounds):.3f} ms per call "
              f"({min(rounds):.3f}-{max(rounds):.3f})")


if __name__ == "__main__":
    main()
