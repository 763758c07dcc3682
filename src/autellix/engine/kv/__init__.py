"""The engine's KV cache beyond vLLM's own blocks: what the scheduler plugin keeps and moves.

``connector`` is vLLM's KV connector that swaps preempted calls' and paused programs' blocks to a host
pool (``--kv-transfer-config``'s ``kv_connector_module_path``: ``autellix.engine.kv.connector``);
``pool`` the host pool's rows and the resume accounting; ``swap`` the block copies between device and
host (torch); ``kernel`` the CUDA gather/scatter in ``csrc/`` that ``swap`` uses when built;
``retention`` holds paused programs' prefixes in vLLM's cache (``autellix.core.kv_retention`` decides).
Imports nothing on its own: ``kernel`` and ``swap`` stay importable with torch alone.
"""
