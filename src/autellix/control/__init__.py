"""Request control, free of transport: sessions, the program store, and the
request controller (arrival -> candidates -> balancer -> annotation -> settle).

The store (programs, stored responses, engine drains; in memory or shared through
Redis) has its own room, ``autellix.control.store``.

The aiohttp gateway (``autellix.gateway``) drives it against real engines; the
simulator can drive it on its virtual clock against its engine model."""

from __future__ import annotations

from autellix.control.controller import (
    Attempt,
    AttemptLog,
    CallLog,
    CallSpec,
    ControllerObserver,
    EngineCall,
    EngineDirectory,
    EngineFailure,
    RequestController,
    RetryPolicy,
)
from autellix.control.sessions import CallOwner, Sessions
from autellix.control.store.programs import MemoryProgramStore, ProgramStore

__all__ = ["Attempt", "AttemptLog", "CallLog", "CallOwner", "CallSpec", "ControllerObserver", "EngineCall",
           "EngineDirectory", "EngineFailure", "MemoryProgramStore", "ProgramStore", "RequestController",
           "RetryPolicy", "Sessions"]
