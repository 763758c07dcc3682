"""Autellix's policy core: the paper's algorithms, pure and deterministic.

No I/O, no clock, no third-party import: time and engine load are arguments.
The gateway, the vLLM scheduler plugin and the simulator all run this code.
"""

from __future__ import annotations

from autellix.core.balancers import (
    NOTHING_CACHED,
    UNKNOWN_SLOTS,
    Balancer,
    LeastUsedBalancer,
    LocalityBalancer,
    NoEngine,
    PrefixScoreBalancer,
    RoundRobinBalancer,
    Route,
    balancer_from_config,
    least_used_engine,
    reads_cache,
)
from autellix.core.block_hashes import VllmBlockHasher
from autellix.core.config import BALANCERS, DEFAULT_CONFIG, POLICIES, ConfigError, SchedulerConfig
from autellix.core.mlq import MultiLevelQueue, ProgramView, QueuedCall, QueueSpec
from autellix.core.policies import ATLAS, FCFS, MLFQ, PLAS, Policy, policy_by_name
from autellix.core.prefix_index import PrefixIndex
from autellix.core.process_table import (
    ActiveCall,
    DuplicateProgram,
    ProcessTable,
    ProgramEntry,
    UnknownCall,
    UnknownProgram,
)
from autellix.core.tenant_shares import TenantShare, TenantShares

__all__ = [
    "ATLAS",
    "BALANCERS",
    "DEFAULT_CONFIG",
    "FCFS",
    "MLFQ",
    "NOTHING_CACHED",
    "PLAS",
    "POLICIES",
    "UNKNOWN_SLOTS",
    "ActiveCall",
    "Balancer",
    "ConfigError",
    "DuplicateProgram",
    "LeastUsedBalancer",
    "LocalityBalancer",
    "MultiLevelQueue",
    "NoEngine",
    "Policy",
    "PrefixIndex",
    "PrefixScoreBalancer",
    "ProcessTable",
    "ProgramEntry",
    "ProgramView",
    "QueueSpec",
    "QueuedCall",
    "RoundRobinBalancer",
    "Route",
    "SchedulerConfig",
    "TenantShare",
    "TenantShares",
    "UnknownCall",
    "UnknownProgram",
    "VllmBlockHasher",
    "balancer_from_config",
    "least_used_engine",
    "policy_by_name",
    "reads_cache",
]
