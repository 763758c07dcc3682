"""Does Envoy fail open with the picker down, whatever the request body mode?

Starts an instant upstream (``experiments/instant_engine.py``), ``autellix epp`` and
Envoy (``autellix_lab.gie_envoy``) with two FailOpen listeners
(``failure_mode_allow: true``) that differ only in how the request body goes to
the picker: GIE's ``FULL_DUPLEX_STREAMED``, and ``BUFFERED``. Kills the picker,
then sends the same number of whole chat calls to each listener, one at a time,
and counts the answers by status. Counts, not timings: it runs anywhere.

Run: ``.venv/bin/python experiments/failopen_body_modes.py [--calls 50]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from autellix.child_processes import free_ports, owned_child, stop_process
from autellix_lab.epp_local import LocalGie, PickerProcess
from autellix_lab.gie_envoy import GatewayListener

BODY = json.dumps({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()


def status_of(url: str) -> int:
    request = urllib.request.Request(url + "/v1/chat/completions", data=BODY,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=50, help="calls per listener with the picker down")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="autellix-failopen-"))
    engine_port, duplex_port, buffered_port = free_ports(3)
    with (logs / "engine.log").open("wb") as log:
        engine = subprocess.Popen([sys.executable, str(Path(__file__).with_name("instant_engine.py")), "--port",
                                   str(engine_port)], stdout=log, stderr=subprocess.STDOUT, **owned_child())
    try:
        picker = PickerProcess([f"http://127.0.0.1:{engine_port}"], log_path=logs / "epp.log")
        listeners = [GatewayListener(duplex_port, fail_open=True),
                     GatewayListener(buffered_port, fail_open=True, request_body="BUFFERED")]
        with LocalGie(picker, listeners, workdir=logs / "envoy").running() as gie:
            urls = dict(zip(("FULL_DUPLEX_STREAMED", "BUFFERED"), gie.urls(), strict=True))
            up = {mode: collections.Counter(status_of(url) for _ in range(5)) for mode, url in urls.items()}
            picker.kill()
            time.sleep(1.0)
            down = {mode: collections.Counter(status_of(url) for _ in range(args.calls)) for mode, url in urls.items()}
    finally:
        stop_process(engine)
    print(json.dumps({"picker_up": up, "picker_down": down, "logs": str(logs)}, indent=2))


if __name__ == "__main__":
    main()
