"""The AMX tile state in vLLM's processes (``autellix.engine.amx``).

The end-to-end case, an ``--enforce-eager`` engine whose first call is a
2-token prompt, is ``test_scheduler_on_engine.py``: its engine's model worker
died of SIGILL on AMX hosts before the plugin.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from autellix.engine.amx import amx_permitted

pytestmark = pytest.mark.skipif(
    amx_permitted() is None or not torch.cpu._is_amx_tile_supported(), reason="the CPU has no AMX"
)

#: Permission before and after vLLM loads its general plugins, in a fresh process.
PROBE = """
from autellix.engine.amx import amx_permitted
before = amx_permitted()
from vllm.plugins import load_general_plugins
load_general_plugins()
print(before, amx_permitted())
"""


def permission_before_and_after_plugins(**env: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, check=True,
                         env={**os.environ, **env})
    return out.stdout.split()[-2:]


def test_vllm_processes_get_the_tile_state_from_the_general_plugin() -> None:
    # before: nothing in the process has asked for it, so an AMX instruction would be SIGILL
    assert permission_before_and_after_plugins() == ["False", "True"]


def test_it_is_the_plugin_that_asks() -> None:
    # VLLM_PLUGINS is vLLM's allow-list: the other general plugins alone leave the
    # tile state unrequested (and a deployment that sets it must name autellix-amx)
    assert permission_before_and_after_plugins(VLLM_PLUGINS="lora_filesystem_resolver") == ["False", "False"]
