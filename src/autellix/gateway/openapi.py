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

from autellix import protocol as wire

OPENAPI_PATH = "/openapi.json"
VERSION = "0.1.0"

ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "code": {"type": ["string", "null"]}, "param": {"type": ["string", "null"]}}}},
}
#: Anthropic's error shape (the Messages API's routes).
ANTHROPIC_ERROR = {
    "type": "object", "required": ["type", "error"],
    "properties": {"type": {"const": "error"}, "error": {
        "type": "object", "required": ["type", "message"],
        "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}},
}
SESSION_CREATED = {
    "type": "object", "required": ["id", "object"],
    "properties": {"id": {"type": "string"}, "object": {"const": wire.SESSION_OBJECT},
                   "tenant": {"type": ["string", "null"]}, "parent": {"type": ["string", "null"]}},
}
PRIORITY_CLASS = {"type": ["integer", "null"], "minimum": -wire.MAX_PRIORITY_CLASS,
                  "maximum": wire.MAX_PRIORITY_CLASS}
EXPECTED_TOKENS = {"type": ["integer", "null"], "minimum": 1, "maximum": wire.MAX_EXPECTED_TOKENS}
PARENT_BODY = {"type": "object", "additionalProperties": False,
               "properties": {"parent": {"type": ["string", "null"], "minLength": 1}, "priority": PRIORITY_CLASS,
                              wire.EXPECTED_TOKENS_FIELD: EXPECTED_TOKENS}}
SESSION_VIEW = {
    "type": "object", "required": ["object", "service", "waiting", "calls_done", "calls_active"],
    "properties": {"object": {"const": wire.SESSION_OBJECT}, "service": {"type": "number", "minimum": 0},
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
RESPONSES_REQUEST = {"type": "object", "required": ["model", "input"], "properties": {
    "model": {"type": "string", "minLength": 1},
    "input": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "object"}}]},
    "instructions": {"type": "string", "minLength": 1},
    "previous_response_id": {"type": "string", "minLength": 1, "maxLength": 256},
    "stream": {"type": "boolean"}, "store": {"type": "boolean"}, "background": {"const": False},
    "max_output_tokens": {"type": "integer", "minimum": 1}},
    "not": {"required": ["request_id"]}}
ANTHROPIC_MESSAGE = {"type": "object", "required": ["role", "content"], "properties": {
    "role": {"enum": ["user", "assistant"]},
    "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {
        "type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}}}]}}}
MESSAGES_REQUEST = {"type": "object", "required": ["model", "messages", "max_tokens"], "properties": {
    "model": {"type": "string", "minLength": 1},
    "messages": {"type": "array", "minItems": 1, "items": ANTHROPIC_MESSAGE},
    "max_tokens": {"type": "integer", "minimum": 1},
    "system": {"anyOf": [{"type": "string"}, {"type": "array", "items": {
        "type": "object", "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}}]},
    "stream": {"type": "boolean"}}}
COUNT_TOKENS_REQUEST = {**MESSAGES_REQUEST, "required": ["model", "messages"]}
RESPONSE_DELETED = {"type": "object", "required": ["id", "object", "deleted"],
                    "properties": {"id": {"type": "string"}, "object": {"const": "response"},
                                   "deleted": {"const": True}}}
URL_BODY = {"type": "object", "required": ["url"], "additionalProperties": False,
            "properties": {"url": {"type": "string", "minLength": 1}}}
TENANT_BODY = {"type": "object", "additionalProperties": False,
               "properties": {"tenant": {"type": ["string", "null"], "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"},
                              "parent": {"type": ["string", "null"], "minLength": 1}, "priority": PRIORITY_CLASS,
                              wire.EXPECTED_TOKENS_FIELD: EXPECTED_TOKENS}}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int, schema: str = "Error") -> dict[str, Any]:
    text = {400: "invalid request", 401: "missing or wrong key",
            404: "no such session, model, response or route", 408: "queued too long", 413: "body too large",
            429: "a limit of the key (Retry-After)", 431: "headers too large", 502: "every engine tried failed",
            503: "no engine can take the call (Retry-After)"}
    return {str(s): _json({"$ref": f"#/components/schemas/{schema}"}, text[s]) for s in statuses}


def _session_id_param() -> dict[str, Any]:
    return {"name": "session_id", "in": "path", "required": True,
            "schema": {"type": "string", "minLength": 1, "maxLength": wire.MAX_ID_LENGTH}}


def _call_route(schema: dict[str, Any], summary: str, *, errors: str = "Error") -> dict[str, Any]:
    headers = [{"name": name, "in": "header", "required": False,
                "schema": {"type": "string", "minLength": 1, "maxLength": wire.MAX_ID_LENGTH}}
               for name in (wire.SESSION_HEADER, wire.THREAD_HEADER, wire.PARENT_HEADER,
                            *wire.IMPLICIT_SESSION_HEADERS)]
    headers.append({"name": wire.PRIORITY_HEADER, "in": "header", "required": False,
                    "schema": {"type": "string", "pattern": r"^-?[0-9]{1,7}$"}})
    headers.append({"name": wire.EXPECTED_TOKENS_HEADER, "in": "header", "required": False,
                    "schema": {"type": "string", "pattern": r"^[1-9][0-9]{0,8}$"}})
    return {"post": {"summary": summary, "parameters": headers,
                     "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
                     "responses": {"200": {"description": "the engine's answer (JSON, or SSE when streamed)",
                                           "content": {"application/json": {"schema": {"type": "object"}},
                                                       # each server-sent event: its data is a JSON chunk,
                                                       # an error event, or [DONE]
                                                       "text/event-stream": {"schema": {
                                                           "type": "object", "required": ["data"],
                                                           "properties": {"data": {"type": "string"}}}}}},
                                   **_errors(400, 401, 404, 413, 429, 502, 503, schema=errors)}}}


def _responses_route(schema: dict[str, Any]) -> dict[str, Any]:
    """``POST /v1/responses``, linked to the routes that take the id it returns (so a fuzzer reaches them)."""
    route = _call_route(schema, "OpenAI response (a previous_response_id chain is one program)")
    route["post"]["operationId"] = "createResponse"
    route["post"]["responses"]["200"]["links"] = {
        name: {"operationId": operation, "parameters": {"response_id": "$response.body#/id"}}
        for name, operation in (("GetResponse", "getResponse"), ("DeleteResponse", "deleteResponse"),
                                ("CancelResponse", "cancelResponse"))}
    return route


def _response_id_param() -> dict[str, Any]:
    return {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}


def _document(title: str, paths: dict[str, Any]) -> dict[str, Any]:
    return {"openapi": "3.1.0", "info": {"title": title, "version": VERSION},
            "components": {"schemas": {"Error": ERROR, "AnthropicError": ANTHROPIC_ERROR},
                           "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                               "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}}},
            "security": [{"bearer": []}, {"apiKey": []}, {}], "paths": paths}


def tenant_document(models: list[str] | None = None) -> dict[str, Any]:
    """``models``: the models served now (the served document names them, so a client or a fuzzer
    knows which calls can reach an engine; another model is a 404 all the same)."""
    chat, completion, responses, messages, count = (CHAT_REQUEST, COMPLETION_REQUEST, RESPONSES_REQUEST,
                                                    MESSAGES_REQUEST, COUNT_TOKENS_REQUEST)
    if models:
        model = {"type": "string", "enum": sorted(models)}
        chat, completion, responses, messages, count = (
            {**schema, "properties": {**schema["properties"], "model": model}}
            for schema in (chat, completion, responses, messages, count))
    return _document("Autellix gateway", {
        wire.CHAT_COMPLETIONS_PATH: _call_route(chat, "OpenAI chat completion, scheduled per program"),
        wire.COMPLETIONS_PATH: _call_route(completion, "OpenAI completion, scheduled per program"),
        wire.RESPONSES_PATH: _responses_route(responses),
        wire.RESPONSE_ROUTE: {"parameters": [_response_id_param()],
                         "get": {"summary": "a stored response, from the engine that stored it",
                                 "operationId": "getResponse",
                                 "responses": {"200": _json({"type": "object"}, "the response"),
                                               **_errors(401, 404)}},
                         "delete": {"summary": "forget a stored response (later chains and retrievals: 404)",
                                    "operationId": "deleteResponse",
                                    "responses": {"200": _json(RESPONSE_DELETED, "deleted"), **_errors(401, 404)}}},
        wire.RESPONSE_CANCEL_ROUTE: {"parameters": [_response_id_param()],
                                "post": {"summary": "cancel a background response (the engine answers)",
                                         "operationId": "cancelResponse",
                                         "responses": {"200": _json({"type": "object"}, "the response"),
                                                       "400": _json({"$ref": "#/components/schemas/Error"},
                                                                    "not a background response"),
                                                       **_errors(401, 404)}}},
        wire.MESSAGES_PATH: _call_route(messages, "Anthropic message, scheduled per program", errors="AnthropicError"),
        wire.MESSAGES_COUNT_TOKENS_PATH: {"post": {
            "summary": "Anthropic token count of a message (no program call)",
            "requestBody": {"required": True, "content": {"application/json": {"schema": count}}},
            "responses": {"200": _json({"type": "object", "required": ["input_tokens"],
                                        "properties": {"input_tokens": {"type": "integer"}}}, "the count"),
                          **_errors(400, 401, 404, 413, 503, schema="AnthropicError")}}},
        wire.MODELS_PATH: {"get": {"summary": "models the healthy engines serve",
                              "responses": {"200": _json(LIST, "models"), **_errors(401)}}},
        wire.SESSIONS_PATH: {"post": {"summary": "open a program's session (a subagent of 'parent', if named)",
                                 "requestBody": {"required": False,
                                                 "content": {"application/json": {"schema": PARENT_BODY}}},
                                 "responses": {"201": _json(SESSION_CREATED, "the new session"),
                                               **_errors(400, 401, 404, 429)}}},
        wire.SESSION_ROUTE: {"parameters": [_session_id_param()],
                  "get": {"summary": "the session's process-table entry",
                          "responses": {"200": _json(SESSION_VIEW, "the entry"), **_errors(401, 404)}},
                  "delete": {"summary": "end the session",
                             "responses": {"200": _json(SESSION_VIEW, "its final entry"), **_errors(401, 404)}}},
        wire.HEALTH_PATH: {"get": {"summary": "the process serves", "security": [{}],
                              "responses": {"200": _json({"type": "object"}, "up")}}},
        wire.READY_PATH: {"get": {"summary": "an engine is healthy", "security": [{}],
                             "responses": {"200": _json({"type": "object"}, "ready"),
                                           "503": _json({"type": "object"}, "no healthy engine")}}},
        OPENAPI_PATH: {"get": {"summary": "this document", "security": [{}],
                               "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1")}}},
    })


def admin_document() -> dict[str, Any]:
    return _document("Autellix gateway: admin listener", {
        wire.ADMIN_ENGINES_PATH: {"get": {"summary": "the engine pool",
                                     "responses": {"200": _json(LIST, "engines"), **_errors(401)}}},
        wire.ADMIN_DRAIN_PATH: {"post": {"summary": "take no new call on an engine", "requestBody": {
            "required": True, "content": {"application/json": {"schema": URL_BODY}}},
            "responses": {"200": _json({"type": "object"}, "the engine"), **_errors(400, 401)}}},
        wire.ADMIN_UNDRAIN_PATH: {"post": {"summary": "back in the pool", "requestBody": {
            "required": True, "content": {"application/json": {"schema": URL_BODY}}},
            "responses": {"200": _json({"type": "object"}, "the engine"), **_errors(400, 401)}}},
        wire.ADMIN_ADMISSION_PATH: {"get": {"summary": "program admission: admitted and waiting programs, limits",
                                            "responses": {"200": _json({"type": "object", "required": ["enabled"]},
                                                                       "admission"), **_errors(401)}}},
        wire.ADMIN_TENANTS_PATH: {"get": {
            "summary": "tenants' shares of model time: weight, service, lead, recent share",
            "responses": {"200": _json(LIST, "tenants"), **_errors(401)}}},
        wire.ADMIN_CALLS_PATH: {"get": {"summary": "recent calls and their attempts", "parameters": [
            {"name": "limit", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}],
            "responses": {"200": _json(LIST, "calls"), **_errors(400, 401)}}},
        wire.ADMIN_SESSIONS_PATH: {"post": {"summary": "open a session owned by a tenant", "requestBody": {
            "required": False, "content": {"application/json": {"schema": TENANT_BODY}}},
            "responses": {"201": _json(SESSION_CREATED, "the new session"), **_errors(400, 401, 404)}}},
        wire.ADMIN_SESSION_ROUTE: {"parameters": [_session_id_param()],
                              "get": {"summary": "any tenant's session",
                                      "responses": {"200": _json(SESSION_VIEW, "the entry"), **_errors(401, 404)}},
                              "delete": {"summary": "end it", "responses": {
                                  "200": _json(SESSION_VIEW, "its final entry"), **_errors(401, 404)}}},
        OPENAPI_PATH: {"get": {"summary": "this document",
                               "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1")}}},
    })


__all__ = ["OPENAPI_PATH", "admin_document", "tenant_document"]
