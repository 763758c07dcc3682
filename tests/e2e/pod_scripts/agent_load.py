"""In a pod: agent programs against the endpoint, several at once, until told to stop; every call counted.

A program opens a session, makes ``TURNS`` chat calls (each carries the conversation so far and a tool
result, as a ReAct loop does, with ``PAUSE_S`` of "tool" time between calls) and ends its session.
``PROGRAMS`` run at once, one after another in each slot, until the file ``STOP_FILE`` exists (the test
creates it with ``kubectl exec``) or ``DEADLINE_S`` passes; a slot finishes the program it is in. No call
is retried: every answer that is not 2xx counts as a failure, but for a session refused by admission under
overload (429 with Retry-After), which waits and opens again as an agent client does. Standard library
only. The last line printed is a JSON summary; the exit code is 1 when any call failed.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from typing import Any

# As an AgentProgram's Job the operator gives it OPENAI_BASE_URL, OPENAI_API_KEY, AUTELLIX_MODEL and the
# session it opened (AUTELLIX_SESSION): then one program runs in that session, which the operator ends.
BASE = (os.environ.get("BASE_URL") or os.environ["OPENAI_BASE_URL"]).rstrip("/")
KEY = os.environ.get("API_KEY") or os.environ["OPENAI_API_KEY"]
MODEL = os.environ.get("MODEL") or os.environ["AUTELLIX_MODEL"]
GIVEN_SESSION = os.environ.get("AUTELLIX_SESSION")
PROGRAMS = int(os.environ.get("PROGRAMS", "4"))
TURNS = int(os.environ.get("TURNS", "6"))
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "48"))
PAUSE_S = float(os.environ.get("PAUSE_S", "0.2"))
STOP_FILE = os.environ.get("STOP_FILE", "/tmp/stop")
DEADLINE_S = float(os.environ.get("DEADLINE_S", "900"))
#: How long a slot waits after a failed call before it goes on.
FAILURE_PAUSE_S = 1.0
#: With ONCE=1 each slot runs one program and stops.
ONCE = os.environ.get("ONCE", "0") == "1"
#: Every reply MAX_TOKENS long (vLLM's ignore_eos): the tiny model's random weights end replies at random.
FULL_REPLIES = os.environ.get("FULL_REPLIES", "0") == "1"

lock = threading.Lock()
statuses: Counter[str] = Counter()
errors: list[str] = []
failures = 0
programs_done = 0
started = time.monotonic()


def request(method: str, path: str, body: dict[str, Any] | None = None,
            session: str | None = None) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body); status 0 when no answer came. A 429's Retry-After is in ``retry_after``."""
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    if session:
        headers["X-Autellix-Session"] = session
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(BASE + path, data, headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=300) as answer:
            raw = answer.read()
            return answer.status, json.loads(raw) if raw else {}
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read()[:300].decode(errors="replace"),
                          "retry_after": float(exc.headers.get("Retry-After") or 1)}
    except OSError as exc:  # refused, reset, timed out: no HTTP answer at all
        return 0, {"error": repr(exc)}


def record(what: str, status: int, answer: dict[str, Any]) -> bool:
    global failures
    ok = 200 <= status < 300
    with lock:
        statuses[f"{what} {status}"] += 1
        if not ok:
            failures += 1
            if len(errors) < 20:
                errors.append(f"{what}: {status} {answer.get('error')}")
    if not ok:  # a client backs off: instant retries would starve the node being measured
        time.sleep(FAILURE_PAUSE_S)
    return ok


def stopping() -> bool:
    return os.path.exists(STOP_FILE) or time.monotonic() - started > DEADLINE_S


def program(slot: int, number: int) -> None:
    global programs_done
    if GIVEN_SESSION:
        turns(GIVEN_SESSION, slot, number)
        with lock:
            programs_done += 1
        return
    status, opened = request("POST", "/sessions", {})
    while status == 429 and not stopping():  # admission: the engines are saturated, come back later
        with lock:
            statuses["open refused 429"] += 1
        time.sleep(min(opened["retry_after"], 10.0))
        status, opened = request("POST", "/sessions", {})
    if status == 429:
        return
    if not record("open", status, opened):
        return
    session = opened["id"]
    turns(session, slot, number)
    status, ended = request("DELETE", f"/sessions/{session}")
    record("end", status, ended)
    with lock:
        programs_done += 1


def turns(session: str, slot: int, number: int) -> None:
    messages = [{"role": "system", "content": "You are an agent. Think, then call a tool."},
                {"role": "user", "content": f"task {slot}.{number}: find the answer"}]
    for turn in range(TURNS):
        body = {"model": MODEL, "max_tokens": MAX_TOKENS, "messages": messages[-7:]}
        if FULL_REPLIES:
            body["ignore_eos"] = True
        status, answer = request("POST", "/chat/completions", body, session)
        if not record("chat", status, answer):
            break
        reply = answer["choices"][0]["message"]["content"] or ""
        messages += [{"role": "assistant", "content": reply[:200]},
                     {"role": "user", "content": f"tool result {turn}: {len(reply)} characters"}]
        time.sleep(PAUSE_S)  # the tool runs


def slot(index: int) -> None:
    number = 0
    while not stopping():
        program(index, number)
        number += 1
        if ONCE or GIVEN_SESSION:
            return


def main() -> int:
    threads = [threading.Thread(target=slot, args=(i,)) for i in range(PROGRAMS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    summary = {"programs": programs_done, "calls": sum(statuses.values()), "failed": failures,
               "statuses": dict(statuses), "errors": errors, "seconds": round(time.monotonic() - started, 1)}
    print(json.dumps(summary), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
