"""AgentProgram: its session in the gateway, its Job, its status and Events, and the end of its session.

* ``start_program`` (kopf's create/resume; and the programs' pass, for a program
  that could not start): opens the session (once), creates the Job, writes
  phase Pending with reason Started. While the gateway cannot be reached the
  program shows phase Pending, reason GatewayUnreachable.
* ``programs_pass`` (``run.py`` repeats it every ``program_poll_interval``, in
  the leader): for each served program in a running phase, starts it or
  follows it (``watch_program``): mirrors the session's process-table entry
  into status and, once the Job has finished (or is gone), ends the session
  and records the outcome (Succeeded; Failed with reason JobFailed or JobGone).
* ``program_deleted`` (kopf's watch event DELETED, with the program's last
  body, whose status holds the session and the gateway): ends its session.

No finalizer: nothing here is a kopf timer or a deletion handler, so deleting a
program (or its namespace) never waits for an operator. One deleted while no
operator runs leaves its session to the gateway's idle TTL (``program_idle_ttl``).

Status ``reason`` is a CamelCase word (Started, GatewayUnreachable, NameTaken,
InvalidSpec, Succeeded, JobFailed, JobGone) next to ``message``; what the
operator did is a Normal Event, a failure a Warning (a lasting one once).
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any

from autellix.kube import API_VERSION, PROGRAM_KIND, PROGRAM_PLURAL
from autellix.kube.context import Context, ProgramState, describe, expected, named, recovered, report, write_status
from autellix.kube.gateway_client import GatewayError
from autellix.kube.kubeapi import NotOwned, object_path
from autellix.kube.manifests import job_failure, job_name, job_outcome, program_job
from autellix.kube.spec import SpecError, parse_program
from autellix.kube.status import now_iso, parse_iso, session_status

log = logging.getLogger("autellix.kube")

RUNNING_PHASES = ("Pending", "Running")
FINAL_PHASES = ("Succeeded", "Failed")
#: Seconds a deleted program's uid is remembered (longer than any pass over a listing that still held it).
GONE_MEMORY = 600.0


def program_path(namespace: str, name: str) -> str:
    return object_path(API_VERSION, PROGRAM_KIND, namespace, name)


def _path(program: dict[str, Any]) -> str:
    return program_path(program["metadata"]["namespace"], program["metadata"]["name"])


async def served_programs(ctx: Context) -> list[dict[str, Any]]:
    """Every AgentProgram the operator serves: one list per namespace, or one of the whole cluster."""
    if not ctx.namespaces:
        return await ctx.api.list(f"/apis/{API_VERSION}/{PROGRAM_PLURAL}")
    return [p for ns in ctx.namespaces for p in await ctx.api.list(object_path(API_VERSION, PROGRAM_KIND, ns))]


def _elapsed(status: dict[str, Any]) -> float | None:
    start = status.get("startTime")
    if not start:
        return None
    return (datetime.datetime.now(datetime.UTC) - parse_iso(start)).total_seconds()


def started_message(session: str, gateway: str, job: str) -> str:
    return f"Session {session} open in the gateway {gateway}; Job {job} created."


# ---- the start ------------------------------------------------------------------------------
async def start_program(ctx: Context, program: dict[str, Any]) -> None:
    """Open the session (once) and create the Job (if absent); a program that cannot start now says why in
    status (phase Pending) and the programs' pass tries again."""
    meta, status = program["metadata"], program.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") in FINAL_PHASES or status.get("sessionId"):
        return
    state = ctx.program(meta["uid"])
    async with state.lock:
        if meta["uid"] in ctx.gone or state.started:
            return
        await _start(ctx, program, state)


async def _start(ctx: Context, program: dict[str, Any], state: ProgramState) -> None:
    meta, status = program["metadata"], program.get("status") or {}
    path = _path(program)
    try:
        spec = parse_program(program.get("spec") or {})
    except SpecError as exc:
        del ctx.programs[meta["uid"]]
        await write_status(ctx, path, status, {"phase": "Failed", "reason": "InvalidSpec", "message": str(exc)})
        await report(ctx, program, "spec", "InvalidSpec", f"Invalid spec: {exc}")
        return
    state.gateway = state.gateway or spec.gateway or ctx.config.gateway_url
    if state.session is None:
        try:
            state.session = await ctx.gateway.open_session(state.gateway, spec.tenant, spec.priority)
        except GatewayError as exc:
            message = f"Cannot open a session in the gateway {state.gateway}: {exc}"
            await write_status(ctx, path, status, {"phase": "Pending", "reason": "GatewayUnreachable",
                                                   "message": message})
            await report(ctx, program, "start", "GatewayUnreachable", message)
            return
    job = program_job(meta["name"], meta["namespace"], meta["uid"], spec, gateway=state.gateway,
                      session_id=state.session)
    try:
        await ctx.api.apply(job, create_only=True)
    except NotOwned as exc:  # the session is kept for the next try
        await write_status(ctx, path, status, {"phase": "Pending", "reason": "NameTaken", "message": str(exc)})
        await report(ctx, program, "start", "NameTaken", str(exc))
        return
    name = job["metadata"]["name"]
    await write_status(ctx, path, status, {
        "phase": status.get("phase") or "Pending", "reason": "Started",
        "message": started_message(state.session, state.gateway, name), "sessionId": state.session,
        "gateway": state.gateway, "jobName": name, "startTime": status.get("startTime") or now_iso()})
    state.started = True
    recovered(ctx, program, "start")
    await ctx.events.post(program, "Normal", "Started",
                          f"Opened session {state.session} in the gateway {state.gateway}; created Job {name}.")
    log.info("%s: started: session %s, Job %s", named(program), state.session, name)


async def start_or_retry(ctx: Context, program: dict[str, Any]) -> None:
    """``start_program``; a failure that passes (an API conflict, the API server away) is one log line, and
    the programs' pass tries again."""
    try:
        await start_program(ctx, program)
    except Exception as exc:
        if not expected(exc):
            raise
        log.warning("%s: cannot start it now (%s); the next pass tries again", named(program), describe(exc))


# ---- while it runs ------------------------------------------------------------------------------
async def watch_program(ctx: Context, program: dict[str, Any]) -> None:
    """Mirror the session into status; when the Job has finished (or is gone), end the session and record
    the outcome."""
    meta, status = program["metadata"], program.get("status") or {}
    if not status.get("sessionId") or not status.get("gateway") or status.get("phase") not in RUNNING_PHASES:
        return
    state = ctx.program(meta["uid"])
    async with state.lock:
        if meta["uid"] not in ctx.gone:
            await _follow(ctx, program)


async def _follow(ctx: Context, program: dict[str, Any]) -> None:
    meta, status = program["metadata"], program.get("status") or {}
    session, gateway = status["sessionId"], status["gateway"]
    name = status.get("jobName") or job_name(meta["name"])
    job = await ctx.api.get(object_path("batch/v1", "Job", meta["namespace"], name))
    outcome = job_outcome(job) if job else None
    finished = job is None or outcome is not None  # a Job gone: deleted, or collected while no operator ran
    entry = final = None
    unreachable: GatewayError | None = None
    try:
        entry = await ctx.gateway.get_session(gateway, session)
        if finished:
            final = await ctx.gateway.end_session(gateway, session)
    except GatewayError as exc:
        unreachable = exc
    changes: dict[str, Any] = session_status(final or entry, _elapsed(status))
    if not finished:
        assert job is not None
        active = bool(job.get("status", {}).get("active")) or status.get("phase") == "Running"
        changes["phase"] = "Running" if active else "Pending"
        if unreachable is not None:
            message = f"Cannot read session {session} in the gateway {gateway}: {unreachable}"
            changes |= {"reason": "GatewayUnreachable", "message": message}
            await write_status(ctx, _path(program), status, changes)
            await report(ctx, program, "gateway", "GatewayUnreachable", message)
            return
        recovered(ctx, program, "gateway")
        if status.get("reason") != "Started":
            changes |= {"reason": "Started", "message": started_message(session, gateway, name)}
        await write_status(ctx, _path(program), status, changes)
        return
    if job is None:
        reason, message = "JobGone", (f"Job {name} is gone and its outcome was not seen (deleted, or collected "
                                      f"after ttlSecondsAfterFinished while no operator ran).")
    elif outcome == "Succeeded":
        reason, message = "Succeeded", f"Job {name} completed."
    else:
        reason, message = "JobFailed", f"Job {name} failed: {job_failure(job)}."
    if unreachable is None:
        message += f" Session {session} ended after {changes.get('calls', status.get('calls', 0))} calls."
    else:
        message += f" Session {session} not ended ({unreachable}); it ends by the gateway's idle TTL."
    changes |= {"phase": "Succeeded" if reason == "Succeeded" else "Failed", "reason": reason, "message": message,
                "sessionEnded": unreachable is None, "completionTime": now_iso()}
    await write_status(ctx, _path(program), status, changes)
    ctx.programs.pop(meta["uid"], None)
    await ctx.events.post(program, "Normal" if reason == "Succeeded" else "Warning", reason, message)
    ctx.events.forget(meta["uid"])
    (log.info if reason == "Succeeded" and unreachable is None else log.warning)("%s: %s", named(program), message)


async def programs_pass(ctx: Context) -> None:
    """One pass over the served programs in a running phase (``run.py`` repeats it every
    ``program_poll_interval``): start those that have not started, follow the others. A program whose step
    fails is tried again at the next pass."""
    now = time.monotonic()
    for uid in [u for u, since in ctx.gone.items() if now - since > GONE_MEMORY]:
        del ctx.gone[uid]
    listed = set()
    for program in await served_programs(ctx):
        meta, status = program["metadata"], program.get("status") or {}
        if meta.get("deletionTimestamp") or status.get("phase") in FINAL_PHASES or meta["uid"] in ctx.gone:
            continue
        listed.add(meta["uid"])
        try:
            if status.get("sessionId"):
                await watch_program(ctx, program)
            else:
                await start_program(ctx, program)
        except Exception as exc:
            if not expected(exc):
                log.exception("%s: the programs' pass failed", named(program))
                continue
            log.warning("%s: %s; the next pass tries again", named(program), describe(exc))
    for uid in [u for u, s in ctx.programs.items() if u not in listed and not s.lock.locked()]:
        del ctx.programs[uid]  # finished, or gone without an event seen


# ---- the end --------------------------------------------------------------------------------
async def program_deleted(ctx: Context, program: dict[str, Any]) -> None:
    """The program is gone (its DELETED watch event, with its last body): end its session, unless it ended.
    A gateway that cannot be reached leaves the session to its idle TTL."""
    meta, status = program["metadata"], program.get("status") or {}
    uid = meta["uid"]
    ctx.gone[uid] = time.monotonic()
    state = ctx.programs.get(uid) or ProgramState()
    async with state.lock:  # a start or a step under way finishes first
        ctx.programs.pop(uid, None)
        ctx.events.forget(uid)
        session = status.get("sessionId") or state.session
        if not session or status.get("sessionEnded"):
            return
        gateway = status.get("gateway") or state.gateway or (program.get("spec") or {}).get("gateway") or \
            ctx.config.gateway_url
        try:
            await ctx.gateway.end_session(gateway, session)
        except GatewayError as exc:
            log.warning("%s deleted: cannot end its session %s (%s); it ends by the gateway's idle TTL",
                        named(program), session, exc)
            return
        log.info("%s deleted: session %s ended", named(program), session)
