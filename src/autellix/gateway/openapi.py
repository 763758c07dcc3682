"""OpenAPI 3.1 documents of the gateway's own routes: one per listener.

``tenant_document()`` is what the tenants' port serves at ``/openapi.json``
(sessions, models, the two OpenAI call routes as far as the gateway checks
them, probes, errors); ``admin_document()`` the admin listener's. Built from
``autellix.protocol``'s names, so a renamed route is renamed here too; the tests
check every route the apps register is documented and every documented one
exists, and check answers against these schemas.

The call routes' bodies pass through to the engine: the schema states what
the gateway itself refuses (``autellix.gateway.validation``), and leaves the
rest open (``additionalProperties``), as the engine judges it.
"""

from __future__ import annotations

from typing import Any

from autellix.protocol import (
    ADMIN_CALLS_PATH,
    ADMIN_DRAIN_PATH,
    ADMIN_ENGINES_PATH,
    ADMIN_SESSION_ROUTE,
    ADMIN_SESSIONS_PATH,
    ADMIN_UNDRAIN_PATH,
    CHAT_COMPLETIONS_PATH,
    COMPLETIONS_PATH,
    HEALTH_PATH,
    MAX_ID_LENGTH,
    MODELS_PATH,
    READY_PATH,
    SESSION_HEADER,
    SESSION_OBJECT,
    SESSION_ROUTE,
    SESSIONS_PATH,
    THREAD_HEADER,
)

OPENAPI_PATH = "/openapi.json"
VERSION = "0.1.0"

ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "code": {"type": ["string", "null"]}, "param": {"type": ["string", "null"]}}}},
}
SESSION_CREATED = {
    "type": "object", "required": ["id", "object"],
    "properties": {"id": {"type": "string"}, "object": {"const": SESSION_OBJECT},
                   "tenant": {"type": ["string", "null"]}},
}
SESSION_VIEW = {
    "type": "object", "required": ["object", "service", "waiting", "calls_done", "calls_active"],
    "properties": {"object": {"const": SESSION_OBJECT}, "service": {"type": "number", "minimum": 0},
                   "waiting": {"type": "number", "minimum": 0}, "calls_done": {"type": "integer", "minimum": 0},
                   "calls_active": {"type": "integer", "minimum": 0}, "pins": {"type": "object"},
                   "deleted": {"type": "boolean"}},
}
LIST = {"type": "object", "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {"type": "object"}}}}
MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"enum": ["system", "developer", "user", "assistant", "tool", "function"]},
    "content": {"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": {"type": "object"}}]}}}
CHAT_REQUEST = {"type": "object", "required": ["model", "messages"], "properties": {
    "model": {"type": "string", "minLength": 1}, "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
    "stream": {"type": "boolean"}, "n": {"type": "integer", "minimum": 1},
    "max_tokens": {"type": "integer", "minimum": 1}, "max_completion_tokens": {"type": "integer", "minimum": 1}}}
COMPLETION_REQUEST = {"type": "object", "required": ["model", "prompt"], "properties": {
    "model": {"type": "string", "minLength": 1},
    "prompt": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1}]},
    "stream": {"type": "boolean"}, "n": {"type": "integer", "minimum": 1},
    "max_tokens": {"type": "integer", "minimum": 1}}}
URL_BODY = {"type": "object", "required": ["url"], "additionalProperties": False,
            "properties": {"url": {"type": "string", "minLength": 1}}}
TENANT_BODY = {"type": "object", "additionalProperties": False,
               "properties": {"tenant": {"type": ["string", "null"], "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"}}}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    text = {400: "invalid request", 401: "missing or wrong key", 404: "no such session, model or route",
            408: "queued too long", 413: "body too large", 429: "a limit of the key (Retry-After)",
            431: "headers too large", 502: "every engine tried failed",
            503: "no engine can take the call (Retry-After)"}
    return {str(s): _json({"$ref": "#/components/schemas/Error"}, text[s]) for s in statuses}


def _session_id_param() -> dict[str, Any]:
    return {"name": "session_id", "in": "path", "required": True,
            "schema": {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH}}


def _call_route(schema: dict[str, Any], summary: str) -> dict[str, Any]:
    headers = [{"name": name, "in": "header", "required": False,
                "schema": {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH}}
               for name in (SESSION_HEADER, THREAD_HEADER)]
    return {"post": {"summary": summary, "parameters": headers,
                     "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
                     "responses": {"200": {"description": "the engine's answer (JSON, or SSE when streamed)",
                                           "content": {"application/json": {"schema": {"type": "object"}},
                                                       # each server-sent event: its data is a JSON chunk,
                                                       # an error event, or [DONE]
                                                       "text/event-stream": {"schema": {
                                                           "type": "object", "required": ["data"],
                                                           "properties": {"data": {"type": "string"}}}}}},
                                   **_errors(400, 401, 404, 413, 429, 502, 503)}}}


def _document(title: str, paths: dict[str, Any]) -> dict[str, Any]:
    return {"openapi": "3.1.0", "info": {"title": title, "version": VERSION},
            "components": {"schemas": {"Error": ERROR},
                           "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
            "security": [{"bearer": []}, {}], "paths": paths}


def tenant_document(models: list[str] | None = None) -> dict[str, Any]:
    """``models``: the models served now (the served document names them, so a client or a fuzzer
    knows which calls can reach an engine; another model is a 404 all the same)."""
    chat, completion = CHAT_REQUEST, COMPLETION_REQUEST
    if models:
        model = {"type": "string", "enum": sorted(models)}
        chat = {**chat, "properties": {**chat["properties"], "model": model}}
        completion = {**completion, "properties": {**completion["properties"], "model": model}}
    return _document("Autellix gateway", {
        CHAT_COMPLETIONS_PATH: _call_route(chat, "OpenAI chat completion, scheduled per program"),
        COMPLETIONS_PATH: _call_route(completion, "OpenAI completion, scheduled per program"),
        MODELS_PATH: {"get": {"summary": "models the healthy engines serve",
                              "responses": {"200": _json(LIST, "models"), **_errors(401)}}},
        SESSIONS_PATH: {"post": {"summary": "open a program's session",
                                 "responses": {"201": _json(SESSION_CREATED, "the new session"),
                                               **_errors(401, 429)}}},
        SESSION_ROUTE: {"parameters": [_session_id_param()],
                  "get": {"summary": "the session's process-table entry",
                          "responses": {"200": _json(SESSION_VIEW, "the entry"), **_errors(401, 404)}},
                  "delete": {"summary": "end the session",
                             "responses": {"200": _json(SESSION_VIEW, "its final entry"), **_errors(401, 404)}}},
        HEALTH_PATH: {"get": {"summary": "the process serves", "security": [{}],
                              "responses": {"200": _json({"type": "object"}, "up")}}},
        READY_PATH: {"get": {"summary": "an engine is healthy", "security": [{}],
                             "responses": {"200": _json({"type": "object"}, "ready"),
                                           "503": _json({"type": "object"}, "no healthy engine")}}},
        OPENAPI_PATH: {"get": {"summary": "this document", "security": [{}],
                               "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1")}}},
    })


def admin_document() -> dict[str, Any]:
    return _document("Autellix gateway: admin listener", {
        ADMIN_ENGINES_PATH: {"get": {"summary": "the engine pool",
                                     "responses": {"200": _json(LIST, "engines"), **_errors(401)}}},
        ADMIN_DRAIN_PATH: {"post": {"summary": "take no new call on an engine", "requestBody": {
            "required": True, "content": {"application/json": {"schema": URL_BODY}}},
            "responses": {"200": _json({"type": "object"}, "the engine"), **_errors(400, 401)}}},
        ADMIN_UNDRAIN_PATH: {"post": {"summary": "back in the pool", "requestBody": {
            "required": True, "content": {"application/json": {"schema": URL_BODY}}},
            "responses": {"200": _json({"type": "object"}, "the engine"), **_errors(400, 401)}}},
        ADMIN_CALLS_PATH: {"get": {"summary": "recent calls and their attempts", "parameters": [
            {"name": "limit", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}],
            "responses": {"200": _json(LIST, "calls"), **_errors(400, 401)}}},
        ADMIN_SESSIONS_PATH: {"post": {"summary": "open a session owned by a tenant", "requestBody": {
            "required": False, "content": {"application/json": {"schema": TENANT_BODY}}},
            "responses": {"201": _json(SESSION_CREATED, "the new session"), **_errors(400, 401)}}},
        ADMIN_SESSION_ROUTE: {"parameters": [_session_id_param()],
                              "get": {"summary": "any tenant's session",
                                      "responses": {"200": _json(SESSION_VIEW, "the entry"), **_errors(401, 404)}},
                              "delete": {"summary": "end it", "responses": {
                                  "200": _json(SESSION_VIEW, "its final entry"), **_errors(401, 404)}}},
        OPENAPI_PATH: {"get": {"summary": "this document",
                               "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1")}}},
    })


__all__ = ["OPENAPI_PATH", "admin_document", "tenant_document"]
