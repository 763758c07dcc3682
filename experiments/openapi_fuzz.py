"""schemathesis against the gateway's served OpenAPI documents, with a real engine behind it.

Starts one local vLLM engine on the tiny model (``autellix.engine.launch``) and
``autellix gateway`` in front of it with its admin listener, then runs
schemathesis (from PyPI; its own virtual environment, ``--st PATH`` to its
``st``) against ``/openapi.json`` of both listeners with the checks
``not_a_server_error`` and ``response_schema_conformance``:

    python3 -m venv /tmp/st && /tmp/st/bin/pip install schemathesis
    .venv/bin/python experiments/openapi_fuzz.py --st /tmp/st/bin/st [--examples 30]

Prints schemathesis' summary per listener; results are recorded in docs/gateway.md.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from autellix.child_processes import admin_url, free_port, gateway_process
from autellix.engine.launch import start_engine, stop_engine, wait_ready
from autellix.engine.tiny_model import build_tiny_model, default_model_dir

CHECKS = "not_a_server_error,response_schema_conformance"


def fuzz(st: str, base: str, examples: int) -> int:
    done = subprocess.run([st, "run", f"{base}/openapi.json", "--checks", CHECKS, "--max-examples", str(examples),
                           "--request-timeout", "60"], text=True, capture_output=True)
    print(done.stdout[-6000:], done.stderr[-2000:])
    return done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--st", required=True, help="schemathesis' st command")
    parser.add_argument("--examples", type=int, default=30)
    args = parser.parse_args()
    model_dir = build_tiny_model(default_model_dir())
    engine = start_engine(free_port(), log_dir=Path(tempfile.mkdtemp(prefix="autellix-fuzz-")), model_dir=model_dir)
    try:
        wait_ready([engine])
        with gateway_process([engine.url], "--tokenizer", str(model_dir / "tokenizer.json"),
                             "--max-tokens", "64") as base:
            codes = {"tenant": fuzz(args.st, base, args.examples), "admin": fuzz(args.st, admin_url(base),
                                                                                  args.examples)}
        print(codes)
    finally:
        stop_engine(engine)


if __name__ == "__main__":
    main()
