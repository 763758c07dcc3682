"""Which program a call belongs to, and who may see it (no transport).

A call names its program, first match wins:

1. ``X-Autellix-Session``: a session opened by ``POST /v1/sessions`` (unknown or
   ended: 404);
2. Claude Code's subagent headers (``x-claude-code-agent-id`` beside its
   session header): that subagent's own program, a subagent of its spawner's
   program (``x-claude-code-parent-agent-id``) or else of the session's;
3. an agent client's own session header (``AGENT_SESSION_HEADERS``, then the
   GIE/llm-d fairness ids): an implicit session, opened on first use;
4. for the Responses API, the chain of ``previous_response_id``: the program
   of the response it continues, or a new implicit one named after the chain's
   first response (``resolve_chain``);
5. none of these: a one-call program, removed when its call ends.

Parent links. A program opened with a parent (``POST /v1/sessions`` with
``{"parent": ID}``, or a call carrying ``X-Autellix-Parent`` or an agent
client's parent header when its implicit session is opened) is a subagent of
it: the process table ranks the whole tree as one program (``autellix.core``).
``X-Autellix-Parent`` must name a live session of the caller's (else 404); an
agent client's parent header names its implicit session, opened if it is not
live yet (the client knows it exists; the gateway may not have seen a call of
it). A parent header on a call of a program that is already open changes
nothing: a program's parent is fixed when it opens.

With API keys configured a session belongs to the tenant whose key created it;
other tenants get 404, and implicit session ids are scoped per tenant (two
tenants' ``x-session-id: run-1`` are two programs, ``<tenant>/run-1`` in the
table). Every check runs before the first state change.

With a ``ProgramGate`` (``autellix.control.admission``), a new program that is no
subagent waits for admission before it opens while the engines are saturated
(its priority class from ``POST /v1/sessions``'s ``priority`` or the header
``X-Autellix-Priority``), and its leaving frees its place.

With a ``TenantStanding``, a tenant's new program starts at the service its
tenant's recently ended programs carry (``autellix.control.standing``), so
opening fresh sessions does not reset its standing; a subagent starts in its
tree, so it takes no floor of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from autellix.control.admission import ProgramGate
from autellix.control.ids import UniqueIds
from autellix.control.standing import TenantStanding
from autellix.control.store.programs import ProgramStore
from autellix.control.store.responses import StoredResponse
from autellix.core import DuplicateProgram, ProgramEntry
from autellix.protocol import (
    AGENT_PARENT_HEADERS,
    CLAUDE_CODE_AGENT_HEADER,
    CLAUDE_CODE_PARENT_AGENT_HEADER,
    CLAUDE_CODE_SESSION_HEADER,
    IMPLICIT_SESSION_HEADERS,
    MAX_ID_LENGTH,
    MAX_PRIORITY_CLASS,
    PARENT_HEADER,
    PRIORITY_HEADER,
    SESSION_HEADER,
    THREAD_HEADER,
    APIError,
)


@dataclass(frozen=True)
class CallOwner:
    program_id: str
    thread_id: str | None
    #: A one-call program: removed from the table when its call ends.
    ephemeral: bool


def session_not_found(program_id: str, ended: bool, *, param: str | None = None) -> APIError:
    state = "has ended" if ended else "does not exist"
    return APIError(404, f"Session {program_id!r} {state}.", code="session_not_found", param=param)


#: Every header that can name a call's program (rules 1-3).
NAMING_HEADERS = (SESSION_HEADER, CLAUDE_CODE_SESSION_HEADER, *IMPLICIT_SESSION_HEADERS)


class Sessions:
    """Session rules over a ``ProgramStore``; ``owner`` is the caller's identity (None: auth off)."""

    def __init__(self, store: ProgramStore, standing: TenantStanding | None = None,
                 gate: ProgramGate | None = None) -> None:
        self.store = store
        #: Applies to named tenants only: with auth off nobody can be told apart.
        self.standing = standing
        #: Program admission under overload (None: every program starts at once).
        self.gate = gate
        #: Names of the one-call programs of keyless calls.
        self._call_programs = UniqueIds("call-")

    async def open(self, now: float, owner: str | None, *, program_id: str | None = None,
                   implicit: bool = False, parent: str | None = None, priority: int = 0) -> ProgramEntry:
        """A new program; ``parent`` (a table id the caller may see, already checked) makes it a subagent.
        A program that is no subagent is admitted first (it may wait, or get a 429)."""
        program_id = program_id or f"sess-{uuid.uuid4().hex}"
        admitted = self.gate is not None and parent is None
        if admitted:
            assert self.gate is not None
            await self.gate.enter(program_id, priority=priority)
        try:
            entry = await self.store.open(program_id, now, owner=owner, implicit=implicit, parent=parent)
        except BaseException:
            if admitted:
                assert self.gate is not None
                self.gate.leave(program_id)
            raise
        if self.standing is not None and owner is not None and parent is None:
            floor = self.standing.take_floor(owner, now)
            if floor > entry.service:
                entry.service = floor
        return entry

    def program_left(self, entry: ProgramEntry, now: float) -> None:
        """A program left the table (ended, expired, one-call): its service joins its tenant's carry, and its
        place among the admitted programs frees. A subagent's service is its tree's, which its root carries."""
        if self.standing is not None and entry.owner is not None and entry.parent is None:
            self.standing.program_left(entry.owner, entry.tree_service, now)
        if self.gate is not None and entry.parent is None:
            self.gate.leave(entry.program_id)

    async def get(self, program_id: str, owner: str | None, *, param: str | None = None) -> ProgramEntry:
        """The caller's session ``program_id``: an implicit one by the id its header gave, too."""
        for candidate in dict.fromkeys((scoped_id(owner, program_id), program_id)):
            entry = await self.store.load(candidate)
            if entry is not None and entry.owner == owner:
                return entry
        ended = await self.store.ended(scoped_id(owner, program_id)) or await self.store.ended(program_id)
        raise session_not_found(program_id, ended, param=param)

    async def end(self, program_id: str, owner: str | None) -> ProgramEntry:
        entry = await self.get(program_id, owner)
        await self.store.end(entry.program_id)
        self.program_left(entry, entry.last_activity)
        return entry

    async def parent_of_new_session(self, parent: str | None, owner: str | None) -> str | None:
        """``POST /v1/sessions``'s ``parent``: the table id of a live session of the caller's (else 404)."""
        if parent is None:
            return None
        return (await self.get(parent, owner, param="parent")).program_id

    # ---- a call's program ------------------------------------------------------------------
    async def resolve(self, headers: Mapping[str, str], owner: str | None, now: float) -> CallOwner:
        """The program of a call, by its headers (rules 1-3 and 5). Raises (404, 400) before changing anything."""
        named = await self.named(headers, owner, now)
        if named is not None:
            return named
        entry = await self.open(now, owner, program_id=self._call_programs(), priority=header_priority(headers))
        return CallOwner(entry.program_id, header_id(headers, THREAD_HEADER), ephemeral=True)

    async def resolve_chain(self, headers: Mapping[str, str], owner: str | None, now: float, *,
                            previous: StoredResponse | None, response_id: str) -> CallOwner:
        """The program of a Responses call (rule 4 when no header names one): the program of the response
        it continues while that is live, else a new implicit one named after this response."""
        named = await self.named(headers, owner, now)
        if named is not None:
            return named
        thread = header_id(headers, THREAD_HEADER)
        if previous is not None:
            entry = await self.store.load(previous.program_id)
            if entry is not None and entry.owner == owner:
                return CallOwner(entry.program_id, thread, ephemeral=False)
        entry = await self.open(now, owner, program_id=scoped_id(owner, f"chain-{response_id}"), implicit=True,
                                priority=header_priority(headers))
        return CallOwner(entry.program_id, thread, ephemeral=False)

    async def named(self, headers: Mapping[str, str], owner: str | None, now: float) -> CallOwner | None:
        """The program the call's headers name (rules 1-3), opened if implicit and new; None: none named."""
        if not any(map(headers.__contains__, NAMING_HEADERS)):  # most keyless calls: one pass, no parsing
            return None
        thread = header_id(headers, THREAD_HEADER)
        explicit = header_id(headers, SESSION_HEADER)
        if explicit is not None:
            await self.get(explicit, owner)
            return CallOwner(explicit, thread, ephemeral=False)
        claude_session = header_id(headers, CLAUDE_CODE_SESSION_HEADER)
        agent = header_id(headers, CLAUDE_CODE_AGENT_HEADER)
        if claude_session is not None and agent is not None:
            return CallOwner(await self._claude_code_subagent(headers, owner, now, claude_session, agent), thread,
                             ephemeral=False)
        for name in IMPLICIT_SESSION_HEADERS:
            session = header_id(headers, name)
            if session is not None:

                async def parent() -> str | None:
                    return await self._parent_by_header(headers, owner, now)

                return CallOwner(await self._implicit(session, owner, now, parent, header_priority(headers)), thread,
                                 ephemeral=False)
        return None

    async def _implicit(self, session: str, owner: str | None, now: float,
                        parent: Callable[[], Awaitable[str | None]] | None, priority: int = 0) -> str:
        """The implicit session ``session`` (the tenant's own), opened if it is not live, as a subagent of
        what ``parent`` finds (asked only then, after every check)."""
        implicit = scoped_id(owner, session)
        if await self.store.load(implicit) is not None:
            await self.get(implicit, owner)
            return implicit
        if await self.store.ended(implicit):
            raise session_not_found(session, True)
        parent_id = await parent() if parent is not None else None
        try:
            await self.open(now, owner, program_id=implicit, implicit=True, parent=parent_id, priority=priority)
        except DuplicateProgram:  # opened meanwhile by a concurrent call: join it
            await self.get(implicit, owner)
        return implicit

    async def _parent_by_header(self, headers: Mapping[str, str], owner: str | None, now: float) -> str | None:
        """The parent a new implicit session would get: ``X-Autellix-Parent`` (a live session of the caller's,
        else 404), else an agent client's parent header (its implicit session, opened if not live)."""
        explicit = header_id(headers, PARENT_HEADER)
        if explicit is not None:
            return (await self.get(explicit, owner, param=PARENT_HEADER)).program_id
        for name in AGENT_PARENT_HEADERS:
            parent = header_id(headers, name)
            if parent is not None:
                return await self._implicit_parent(parent, owner, now)
        return None

    async def _implicit_parent(self, session: str, owner: str | None, now: float) -> str | None:
        """An agent client's parent session: live, or opened now; None when it ended (the subagent stands alone)."""
        try:
            return await self._implicit(session, owner, now, None)
        except APIError:  # ended: the subagent stands alone
            return None

    async def _claude_code_subagent(self, headers: Mapping[str, str], owner: str | None, now: float,
                                    session: str, agent: str) -> str:
        """A Claude Code subagent: its own program under the session, a subagent of its spawner's program
        when that is live, else of the session's (opened if not live)."""
        spawner = header_id(headers, CLAUDE_CODE_PARENT_AGENT_HEADER)

        async def parent() -> str | None:
            if spawner is not None:
                spawner_id = scoped_id(owner, _agent_id(session, spawner))
                if await self.store.load(spawner_id) is not None:
                    return spawner_id
            return await self._implicit_parent(session, owner, now)

        return await self._implicit(_agent_id(session, agent), owner, now, parent)


def _agent_id(session: str, agent: str) -> str:
    """A Claude Code subagent's session id: its agent id under its session's (``GET /v1/sessions/{id}``
    takes it as it is: no ``/`` in it)."""
    return f"{session}:agent:{agent}"


def scoped_id(owner: str | None, session_id: str) -> str:
    """An implicit session's id in the table: the tenant's own namespace (tenant names have no '/')."""
    return session_id if owner is None else f"{owner}/{session_id}"


def header_priority(headers: Mapping[str, str]) -> int:
    """A new program's priority class from ``X-Autellix-Priority`` (0 without it; else 400)."""
    value = headers.get(PRIORITY_HEADER)
    if value is None:
        return 0
    return priority_class(value.strip(), PRIORITY_HEADER)


def priority_class(value: object, param: str) -> int:
    """A priority class: an integer from -MAX to MAX (a header's text or a JSON number); else 400."""
    if isinstance(value, str) and value.lstrip("-").isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or abs(value) > MAX_PRIORITY_CLASS:
        raise APIError(400, f"{param} must be an integer from -{MAX_PRIORITY_CLASS} to {MAX_PRIORITY_CLASS} "
                       "(a program's priority class: higher first, below zero sheddable).", param=param)
    return value


def header_id(headers: Mapping[str, str], name: str) -> str | None:
    """A session or thread id from a header: 1 to ``MAX_ID_LENGTH`` printable characters (else 400)."""
    value = headers.get(name)
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > MAX_ID_LENGTH or not value.isprintable():
        raise APIError(400, f"Header {name} must be 1 to {MAX_ID_LENGTH} printable characters.",
                       code="invalid_header", param=name)
    return value
