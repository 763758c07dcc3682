"""The wire contract between Autellix's parts, in one place (standard library only).

Who speaks it:

* agent programs (``autellix.client``, any OpenAI client) -> gateway: the
  session and thread headers, the session routes and objects, OpenAI-style errors;
* gateway -> engines: the scheduling fields added to every call (``priority``
  and the ``vllm_xargs`` keys the engine plugin reads);
* engine plugin -> gateway: the execution-time channel (feedback paths, the
  record of a finished call and an engine's tally of a program);
* operator and tools -> gateway: the admin routes.

Client, gateway, engine plugin, emulator and operator import these names from
here; nothing else defines them. Changing a name here is a wire change: every
side moves together.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import quote

# ---- program identity: headers a call carries -------------------------------------
#: Names the call's program (a session from ``POST /v1/sessions``).
SESSION_HEADER = "X-Autellix-Session"
#: Names the thread of the program the call belongs to (ATLAS's critical path).
THREAD_HEADER = "X-Autellix-Thread"
#: Session ids that agent clients send by themselves, most specific first: the first present names
#: the call's program, an implicit session opened on first use (whose header each is: docs/agents.md).
AGENT_SESSION_HEADERS = (
    "x-dynamo-session-id",        # NVIDIA Dynamo's, for clients that set one explicitly
    "x-claude-code-session-id",   # Claude Code
    "x-session-affinity",         # OpenCode (and llm-d's agent-identity plugin)
    "x-session-id",               # OpenCode, and common to many gateways
    "session-id",                 # Codex CLI
    "session_id",                 # Codex CLI before 0.131
    "agent-session-id",           # Goose
)
#: Flow ids of Gateway API Inference Extension gateways (GIE's, llm-d's two spellings): a program's id
#: when no session header names one.
FAIRNESS_ID_HEADERS = ("x-gateway-inference-fairness-id", "x-llm-d-router-inference-fairness-id",
                       "x-llm-d-inference-fairness-id")
#: Every header that names an implicit session, in precedence order.
IMPLICIT_SESSION_HEADERS = AGENT_SESSION_HEADERS + FAIRNESS_ID_HEADERS
#: Where a call's program key is read, in order: the first present names it. Envoy hashes a call on it
#: (``autellix.mesh.resources``), so a program's calls reach one gateway replica.
PROGRAM_KEY_HEADERS = (SESSION_HEADER, *IMPLICIT_SESSION_HEADERS)


def program_key(headers: Mapping[str, str]) -> str | None:
    """The key Envoy hashes a call on (``PROGRAM_KEY_HEADERS``); None for a one-call program."""
    for name in PROGRAM_KEY_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return None


#: Names the program that spawned this call's program (a subagent's parent): a session id, as in
#: ``SESSION_HEADER``. Read when the subagent's program is opened.
PARENT_HEADER = "X-Autellix-Parent"
#: Agent clients' own parent links: the parent's implicit session id (NVIDIA Dynamo's, OpenCode's).
AGENT_PARENT_HEADERS = ("x-dynamo-parent-session-id", "x-parent-session-id")
#: Claude Code's subagents keep the root's session header and add their own agent id and their
#: spawner's: each subagent is a program of its own, a subagent of its spawner (or of the root).
CLAUDE_CODE_SESSION_HEADER = "x-claude-code-session-id"
CLAUDE_CODE_AGENT_HEADER = "x-claude-code-agent-id"
CLAUDE_CODE_PARENT_AGENT_HEADER = "x-claude-code-parent-agent-id"
#: A new program's priority class for admission under overload (an integer; higher first; below zero:
#: sheddable). ``POST /v1/sessions`` takes it as the field ``priority``.
PRIORITY_HEADER = "X-Autellix-Priority"
#: Bounds of a priority class.
MAX_PRIORITY_CLASS = 1_000_000
#: The tokens a call's program says it will generate in all, on any call (``autellix.control.size_hints``);
#: ``POST /v1/sessions`` takes it as the field ``expected_tokens``.
EXPECTED_TOKENS_HEADER = "X-Autellix-Expected-Tokens"
EXPECTED_TOKENS_FIELD = "expected_tokens"
#: The most tokens a program may declare.
MAX_EXPECTED_TOKENS = 1_000_000_000
#: Longest session or thread id accepted in a header.
MAX_ID_LENGTH = 256

# ---- the gateway's own routes ---------------------------------------------------------
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
#: OpenAI's Responses API: create; retrieve and delete one (``RESPONSE_ROUTE``); cancel a background one.
RESPONSES_PATH = "/v1/responses"
RESPONSE_ROUTE = RESPONSES_PATH + "/{response_id}"
RESPONSE_CANCEL_ROUTE = RESPONSE_ROUTE + "/cancel"
#: Anthropic's Messages API, and its token count.
MESSAGES_PATH = "/v1/messages"
MESSAGES_COUNT_TOKENS_PATH = MESSAGES_PATH + "/count_tokens"
#: Every route that runs a model call (a program's call: counted, ranked, charged).
CALL_PATHS = (CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH, RESPONSES_PATH, MESSAGES_PATH)
MODELS_PATH = "/v1/models"
SESSIONS_PATH = "/v1/sessions"
#: ``GET``/``DELETE`` one session: ``SESSIONS_PATH + "/" + id``.
SESSION_ROUTE = SESSIONS_PATH + "/{session_id}"
SESSION_OBJECT = "autellix.session"
HEALTH_PATH, READY_PATH, METRICS_PATH = "/health", "/ready", "/metrics"

#: Admin routes: the engine pool (``GET``), drain and undrain (``POST {"url": ...}``),
#: recent calls with their attempts (``GET``).
ADMIN_ENGINES_PATH = "/admin/engines"
ADMIN_DRAIN_PATH = ADMIN_ENGINES_PATH + "/drain"
ADMIN_UNDRAIN_PATH = ADMIN_ENGINES_PATH + "/undrain"
ADMIN_CALLS_PATH = "/admin/calls"
#: Program admission under overload: admitted and waiting programs, the limits now.
ADMIN_ADMISSION_PATH = "/admin/admission"
#: Tenants' shares of model time: weight, service, lead over the least served, recent share (``GET``).
ADMIN_TENANTS_PATH = "/admin/tenants"
#: Sessions opened, read and ended on a tenant's behalf (the operator's AgentPrograms):
#: ``POST {"tenant": NAME}``, ``GET``/``DELETE ADMIN_SESSIONS_PATH + "/" + id``.
ADMIN_SESSIONS_PATH = "/admin/sessions"
ADMIN_SESSION_ROUTE = ADMIN_SESSIONS_PATH + "/{session_id}"


def session_path(session_id: str) -> str:
    return f"{SESSIONS_PATH}/{session_id}"


# ---- scheduling fields: what the gateway adds to a call for the engine ----------------
#: The program's queue level (0 = Q1) as vLLM's request ``priority``.
PRIORITY_FIELD = "priority"
#: vLLM's per-request extra arguments (``sampling_params.extra_args`` in the engine).
XARGS_FIELD = "vllm_xargs"
#: Keys inside ``XARGS_FIELD`` that the engine plugin (``autellix.engine.planner``) reads.
XARG_PROGRAM, XARG_THREAD, XARG_CALL = "autellix_program", "autellix_thread", "autellix_call"
XARG_SERVICE, XARG_WAIT = "autellix_service", "autellix_wait"
#: The subagent tree whose totals ``XARG_SERVICE`` and ``XARG_WAIT`` are (sent when not the program itself).
XARG_TREE = "autellix_tree"
#: The model time the program declared it will take (``autellix.core.ProcessTable.declared``; sent when said).
XARG_DECLARED = "autellix_declared"
#: The program's tenant and the tenant's weight (``autellix.core.TenantShares``; sent when the gateway has tenants).
XARG_TENANT, XARG_TENANT_WEIGHT = "autellix_tenant", "autellix_weight"
#: True when the call offers the model tools: its program may call one and come back with the result, so the
#: engine holds its prefix from its first pause (``autellix.core.kv_retention``; sent only when true).
XARG_EXPECT_RETURN = "autellix_expect_return"


@dataclass(frozen=True, slots=True)
class SchedulingFields:
    """What a call tells its engine about its program (backend-neutral).

    ``level`` is the program's queue level under the configured boundaries, or
    None when the gateway sends no priority. An engine backend turns this into
    its own request fields (``autellix.backends``)."""

    program: str
    call: str
    service: float
    wait: float
    thread: str | None = None
    level: int | None = None
    #: The subagent tree ``service`` and ``wait`` are the totals of (None: the program's own).
    tree: str | None = None
    #: The model time the program declared it will take (0: none said).
    declared: float = 0.0
    #: The program's tenant (None: tenants are not told apart) and the tenant's weight.
    tenant: str | None = None
    tenant_weight: float = 1.0
    #: The call offers tools: its program may come back after one runs (``XARG_EXPECT_RETURN``).
    expect_return: bool = False

    def xargs(self) -> dict[str, Any]:
        """The flat ``vllm_xargs`` the engine plugin reads."""
        out: dict[str, Any] = {XARG_PROGRAM: self.program, XARG_CALL: self.call,
                               XARG_SERVICE: round(self.service, 6), XARG_WAIT: round(self.wait, 6)}
        if self.thread is not None:
            out[XARG_THREAD] = self.thread
        if self.tree is not None and self.tree != self.program:
            out[XARG_TREE] = self.tree
        if self.declared > 0:
            out[XARG_DECLARED] = round(self.declared, 6)
        if self.tenant is not None:
            out[XARG_TENANT] = self.tenant
            out[XARG_TENANT_WEIGHT] = self.tenant_weight
        if self.expect_return:
            out[XARG_EXPECT_RETURN] = True
        return out


# ---- the execution-time channel: engine plugin -> gateway --------------------------------
FEEDBACK_PREFIX = "/autellix/v1/"
#: ``GET``: the plugin's scheduler and parameters; 404 when no Autellix scheduler runs.
FEEDBACK_INFO_PATH = FEEDBACK_PREFIX + "info"
#: The info's description of the engine's KV cache events (``autellix.engine.kv_events.describe``): where vLLM
#: publishes them (``endpoint``, ``replay_endpoint``, ``topic``) and how it names blocks (``block_size``,
#: ``hash_algorithm``, ``hash_seed``); absent or null when it publishes none.
INFO_KV_EVENTS = "kv_events"
#: The info's count of calls the engine runs at once (vLLM's ``max_num_seqs``): Algorithm 2 weighs what an
#: engine holds by its size (``autellix.core.balancers.autellix``).
INFO_MAX_NUM_SEQS = "max_num_seqs"
#: A pod's engine publishes its KV cache events on this TCP port, their replay on the next.
KV_EVENTS_PORT = 5557
#: ``GET``: the files the engine tokenizes with, ``{"tokenizer_json": TEXT, "tokenizer_config": {...}}``, so that
#: a gateway without the model can hash prompts as the engine does; 404 when the engine does not describe them.
FEEDBACK_TOKENIZER_PATH = FEEDBACK_PREFIX + "tokenizer"
#: ``GET FEEDBACK_CALLS_PATH + call_id + "?wait=S"``: a finished call's record, read once.
FEEDBACK_CALLS_PATH = FEEDBACK_PREFIX + "calls/"
#: The same route with its parameter, for routers that name it.
FEEDBACK_CALL_ROUTE = FEEDBACK_CALLS_PATH + "{call_id}"
#: Query parameter: seconds to wait for a record that has not arrived yet.
FEEDBACK_WAIT_PARAM = "wait"
FEEDBACK_MAX_WAIT_S = 5.0
#: Engines trust only the gateway: the plugin's routes (and, through vLLM's
#: ``--api-key``, its OpenAI routes) need this header with the token gateway and
#: engines share (``ENGINE_TOKEN_ENV`` on both sides; a Secret in the chart).
ENGINE_TOKEN_HEADER = "X-Autellix-Engine-Token"
ENGINE_TOKEN_ENV = "AUTELLIX_ENGINE_TOKEN"
#: The record in the answer, saving the gateway a second request per call: a call
#: sent with ``CALL_HEADER`` (the gateway's call id) gets its record as the
#: answer's ``RECORD_HEADER`` (the record's JSON, ASCII) when the record is in by
#: the time the answer's headers go out. That is nearly every whole call; a stream's
#: headers go out before its first token, so a stream's record is read from
#: ``FEEDBACK_CALLS_PATH`` as before, as is any record that came in late.
CALL_HEADER = "X-Autellix-Call"
RECORD_HEADER = "X-Autellix-Record"


#: ``GET FEEDBACK_PROGRAMS_PATH + quoted program id``: the engine's tally of one program
#: (``ProgramService``); 404 when no call of it finished on this engine. ``DELETE``: the program's session
#: ended: the engine drops the prefix it holds for it (202; the scheduler takes it at its next step).
FEEDBACK_PROGRAMS_PATH = FEEDBACK_PREFIX + "programs/"


def record_header_value(record: Mapping[str, Any]) -> str:
    """A call record as ``RECORD_HEADER``'s value: its JSON in ASCII (a program id may hold
    any character, a header value only Latin-1)."""
    return json.dumps(record, separators=(",", ":"))


def feedback_call_path(call_id: str) -> str:
    return FEEDBACK_CALLS_PATH + call_id


def feedback_program_path(program_id: str) -> str:
    """The program's tally route; the id percent-encoded whole (it may hold ``/``)."""
    return FEEDBACK_PROGRAMS_PATH + quote(program_id, safe="")


@dataclass(frozen=True, slots=True)
class CallRecord:
    """A call that left the engine: what the gateway charges its program.

    ``service_s`` is the wall time of the engine steps the call was scheduled in
    (model time, no queueing); ``wait_s`` the rest of its time on the engine."""

    call: str | None
    program: str
    finished: bool
    service_s: float
    wait_s: float
    steps: int
    promotions: int
    demotions: int
    preemptions: int

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CallRecord | None:
        """The record in a feedback answer; None when it is not one (missing or
        mistyped fields, a negative or non-finite time)."""
        try:
            service, wait = float(data["service_s"]), float(data["wait_s"])
            if not (math.isfinite(service) and math.isfinite(wait) and service >= 0 and wait >= 0):
                return None
            call = data.get("call")
            return cls(call=call if isinstance(call, str) else None, program=str(data["program"]),
                       finished=bool(data["finished"]), service_s=service, wait_s=wait,
                       steps=int(data.get("steps", 0)), promotions=int(data.get("promotions", 0)),
                       demotions=int(data.get("demotions", 0)), preemptions=int(data.get("preemptions", 0)))
        except (KeyError, TypeError, ValueError):
            return None


CALL_RECORD_FIELDS = tuple(f.name for f in fields(CallRecord))


@dataclass(frozen=True, slots=True)
class ProgramService:
    """An engine's tally of one program: the model time (``service_s``, as in each call's
    ``CallRecord``) of the program's calls that finished on this engine, how many, and
    ``since``, the wall-clock (Unix) time at which it counted the first of them. Each call
    runs on one engine, so the engines' tallies of a program add up to the service the
    gateway charged for those calls; ``since`` tells a tally of an earlier program under
    the same id (the id ended and was reused) from this one's."""

    program: str
    service_s: float
    calls: int
    since: float

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProgramService | None:
        """The tally in an engine's answer; None when it is not one."""
        try:
            service, since, calls = float(data["service_s"]), float(data["since"]), int(data["calls"])
            if not (math.isfinite(service) and math.isfinite(since) and service >= 0 and calls >= 0):
                return None
            return cls(program=str(data["program"]), service_s=service, calls=calls, since=since)
        except (KeyError, TypeError, ValueError):
            return None


# ---- errors: OpenAI's shape ---------------------------------------------------------------
class APIError(Exception):
    """An OpenAI-style error, ``{"error": {"message", "type", "code", "param"}}``
    with an HTTP status. Raised before any state changes, so a rejected request
    leaves the program state as it found it; a transport turns it into its answer.
    ``retry_after``: seconds to wait before trying again (a ``Retry-After`` value), when known."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self._retry_after = retry_after

    @property
    def retry_after(self) -> str | None:
        return self._retry_after

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}


__all__ = [
    "ADMIN_ADMISSION_PATH",
    "ADMIN_CALLS_PATH",
    "ADMIN_DRAIN_PATH",
    "ADMIN_ENGINES_PATH",
    "ADMIN_SESSIONS_PATH",
    "ADMIN_SESSION_ROUTE",
    "ADMIN_TENANTS_PATH",
    "ADMIN_UNDRAIN_PATH",
    "AGENT_PARENT_HEADERS",
    "AGENT_SESSION_HEADERS",
    "CALL_HEADER",
    "CALL_PATHS",
    "CALL_RECORD_FIELDS",
    "CHAT_COMPLETIONS_PATH",
    "CLAUDE_CODE_AGENT_HEADER",
    "CLAUDE_CODE_PARENT_AGENT_HEADER",
    "CLAUDE_CODE_SESSION_HEADER",
    "COMPLETIONS_PATH",
    "ENGINE_TOKEN_ENV",
    "ENGINE_TOKEN_HEADER",
    "FAIRNESS_ID_HEADERS",
    "FEEDBACK_CALLS_PATH",
    "FEEDBACK_CALL_ROUTE",
    "FEEDBACK_INFO_PATH",
    "FEEDBACK_MAX_WAIT_S",
    "FEEDBACK_PREFIX",
    "FEEDBACK_PROGRAMS_PATH",
    "FEEDBACK_TOKENIZER_PATH",
    "FEEDBACK_WAIT_PARAM",
    "HEALTH_PATH",
    "IMPLICIT_SESSION_HEADERS",
    "INFO_KV_EVENTS",
    "INFO_MAX_NUM_SEQS",
    "KV_EVENTS_PORT",
    "MAX_ID_LENGTH",
    "MAX_PRIORITY_CLASS",
    "MESSAGES_COUNT_TOKENS_PATH",
    "MESSAGES_PATH",
    "METRICS_PATH",
    "MODELS_PATH",
    "PARENT_HEADER",
    "PRIORITY_FIELD",
    "PRIORITY_HEADER",
    "PROGRAM_KEY_HEADERS",
    "READY_PATH",
    "RECORD_HEADER",
    "RESPONSES_PATH",
    "RESPONSE_CANCEL_ROUTE",
    "RESPONSE_ROUTE",
    "SESSIONS_PATH",
    "SESSION_HEADER",
    "SESSION_OBJECT",
    "SESSION_ROUTE",
    "THREAD_HEADER",
    "XARGS_FIELD",
    "XARG_CALL",
    "XARG_EXPECT_RETURN",
    "XARG_PROGRAM",
    "XARG_SERVICE",
    "XARG_TENANT",
    "XARG_TENANT_WEIGHT",
    "XARG_THREAD",
    "XARG_TREE",
    "XARG_WAIT",
    "APIError",
    "CallRecord",
    "ProgramService",
    "SchedulingFields",
    "feedback_call_path",
    "feedback_program_path",
    "program_key",
    "record_header_value",
    "session_path",
]
