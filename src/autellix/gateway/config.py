"""The gateway's configuration: one typed model, every field named and defaulted once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autellix.backends import DEFAULT_BACKEND
from autellix.control.limits import TenantLimits
from autellix.core import SchedulerConfig
from autellix.gateway.engines import Discovery
from autellix.gateway.validation import MAX_N, MAX_TOKENS


@dataclass
class GatewayConfig:
    engines: list[str] = field(default_factory=list)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    #: Largest accepted request body.
    max_body_bytes: int = 4 * 1024 * 1024
    #: Send the program's queue level as the engine's priority (vLLM engines need
    #: ``--scheduling-policy priority`` or the Autellix scheduler).
    engine_priority: bool = True
    poll_interval: float = 1.0
    #: Tenants' keys: a file or a mounted Secret's directory (``autellix.control.keys``), and/or
    #: ``$AUTELLIX_API_KEYS``. None of both: no tenant auth (only on loopback or with ``--allow-anonymous``).
    api_keys_file: Path | None = None
    #: Keys of the admin listener: a file or a Secret's directory, and/or ``$AUTELLIX_ADMIN_KEYS``.
    admin_keys_file: Path | None = None
    #: The admin listener (engines, drain, calls, sessions on a tenant's behalf), apart from the
    #: tenants' port; None: no admin listener; 0: any free port (``Gateway.admin_url`` says which).
    admin_port: int | None = None
    admin_host: str = "127.0.0.1"
    #: Serve tenants without keys beyond loopback (``--allow-anonymous``); off, such a start is refused.
    allow_anonymous: bool = False
    #: Per-tenant limits (``autellix.control.limits``); the default limits nothing.
    tenant_limits: TenantLimits = field(default_factory=TenantLimits)
    #: Half-life (seconds) of a tenant's standing: its new programs start at the service its recent
    #: programs carried (``autellix.control.standing``); None or 0: off. Named tenants only.
    standing_half_life: float | None = 60.0
    #: Tenants with limits of their own (tenant name -> limits).
    per_tenant_limits: dict[str, TenantLimits] = field(default_factory=dict)
    #: Seconds between two checks of the key files for changes (reload without restart).
    keys_reload_interval: float = 5.0
    #: The token engines take calls with (header ``X-Autellix-Engine-Token``); None: ``$AUTELLIX_ENGINE_TOKEN``.
    engine_token: str | None = None
    #: The model's ``tokenizer.json``, or its folder: exact prompt lengths; a folder with a chat template
    #: (``tokenizer_config.json``) also gives Chat Completions prompts' KV blocks for the KV event index.
    tokenizer: Path | None = None
    #: Follow the engines' KV cache events (those that describe them) and route by what they hold, when the
    #: balancer weighs it (``core.reads_cache``) and ``tokenizer`` is a model folder with a chat template.
    kv_index: bool = True
    #: Upper bounds of a call's ``n`` and ``max_tokens`` (``max_completion_tokens``): larger is a 400.
    max_n: int = MAX_N
    max_tokens: int = MAX_TOKENS
    #: Engines one call may try in all (its retry budget), when engines fail before answering.
    max_attempts: int = 3
    #: Full-jitter backoff between attempts: up to this many seconds, doubling per failed attempt.
    retry_backoff: float = 0.05
    #: Seconds an engine has to answer a streamed call's headers (vLLM does so
    #: once the call is queued); after that the call moves to another engine.
    stream_header_timeout: float | None = 30.0
    #: Timeouts of one attempt at an engine (seconds; None: none): connecting; a whole call's answer
    #: (its headers come with its last token: first byte and total in one); a stream's silence
    #: between two chunks once its headers are in; the whole attempt; and a client that reads
    #: nothing of its stream (a slow reader holds its call and its engine's slot).
    connect_timeout: float | None = 5.0
    whole_timeout: float | None = 600.0
    idle_read_timeout: float | None = 120.0
    attempt_timeout: float | None = 1800.0
    write_timeout: float | None = 60.0
    discovery: Discovery | None = None
    #: The engines' kind (``autellix.backends.BACKENDS``).
    backend: str = DEFAULT_BACKEND
    #: Program admission under overload (``autellix.control.admission``): new programs wait while the
    #: engines are saturated; off: every program starts at once.
    program_admission: bool = True
    #: Running slots of each engine (vLLM's ``max_num_seqs``; its metrics do not say): admission's queue bound.
    engine_slots: int = 256
    #: The store shared by gateway replicas and pickers (``redis://``, ``rediss://`` or ``unix://``): their
    #: programs, stored responses and engine drains (``autellix.control.store.base``); None: in memory.
    #: Out of the repr: the URL may carry the store's password.
    store_url: str | None = field(default=None, repr=False)
    #: Seconds a stored Responses API response can be chained from (``previous_response_id``)
    #: through this gateway: where it is stored is remembered this long after it was created.
    response_ttl: float = 86_400.0


__all__ = ["GatewayConfig"]
