"""The engine's preStop hook: wait until it holds no call, then let it stop.

When an engine pod starts terminating, its endpoint turns not-ready and the
gateways stop sending it new calls; vLLM would abort the calls in flight on
SIGTERM. The pod's preStop hook runs this first:

    autellix engine drain-wait --url http://127.0.0.1:8000

It reads the engine's ``/metrics`` every ``--interval`` seconds with the same
parser and the same backend rule as the gateway's engine pool
(``EngineBackend.drain_ready``: for vLLM, no running and no waiting request)
and returns once the engine was idle ``--idle-polls`` times in a row (a call
routed just before the endpoint went not-ready may still be on its way).
An engine that does not answer has nothing left to drain. The pod's
``terminationGracePeriodSeconds`` bounds the wait; ``--timeout`` can bound it
earlier. Also runs as ``python -m autellix.backends.drain``.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

from autellix.backends import BACKENDS, DEFAULT_BACKEND, EngineBackend, backend_by_name
from autellix.backends.scrape import parse_metrics

DEFAULT_URL = "http://127.0.0.1:8000"


def read_metrics(url: str, names: frozenset[str], timeout: float = 5.0) -> dict[str, float]:
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout) as r:
        return parse_metrics(r.read().decode(), names)


def wait_drained(url: str, backend: EngineBackend, *, interval: float = 2.0, timeout: float | None = None,
                 idle_polls: int = 2, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> str:
    """Poll until drained. Returns ``drained``, ``gone`` (the engine does not answer) or ``timeout``."""
    deadline = None if timeout is None else clock() + timeout
    idle = 0
    while True:
        try:
            metrics = read_metrics(url, backend.pool_metrics)
        except (OSError, urllib.error.URLError, ValueError) as exc:
            say(f"drain-wait: {url} does not answer ({exc}); nothing left to drain")
            return "gone"
        if backend.drain_ready(metrics):
            idle += 1
            if idle >= idle_polls:
                say(f"drain-wait: {url} holds no call")
                return "drained"
        else:
            idle = 0
            load = backend.load(metrics)
            say(f"drain-wait: {url} still has {load.running:g} running and {load.waiting:g} waiting")
        if deadline is not None and clock() + interval > deadline:
            say(f"drain-wait: gave up after {timeout:g} s")
            return "timeout"
        sleep(interval)


def main(argv: Sequence[str] | None = None, *, default_url: str = DEFAULT_URL) -> int:
    parser = argparse.ArgumentParser(prog="autellix engine drain-wait", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=default_url, help=f"the engine's base URL (default {default_url})")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between reads of /metrics")
    parser.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    parser.add_argument("--idle-polls", type=int, default=2, help="idle reads in a row that mean drained")
    parser.add_argument("--backend", default=DEFAULT_BACKEND, choices=sorted(BACKENDS), help="the engine's kind")
    args = parser.parse_args(argv)
    if args.interval <= 0 or args.idle_polls < 1 or (args.timeout is not None and args.timeout <= 0):
        parser.error("--interval and --timeout must be > 0, --idle-polls >= 1")
    result = wait_drained(args.url, backend_by_name(args.backend), interval=args.interval, timeout=args.timeout,
                          idle_polls=args.idle_polls)
    return 1 if result == "timeout" else 0


if __name__ == "__main__":
    sys.exit(main())
