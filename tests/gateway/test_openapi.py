"""The OpenAPI documents: valid, and they name exactly the routes each listener serves."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from autellix.gateway.admin import create_admin_app
from autellix.gateway.compose import create_app
from autellix.gateway.config import GatewayConfig
from autellix.gateway.openapi import OPENAPI_PATH, admin_document, tenant_document


def schemas(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        found = [node["schema"]] if isinstance(node.get("schema"), dict) else []
        return found + [s for v in node.values() for s in schemas(v)]
    if isinstance(node, list):
        return [s for v in node for s in schemas(v)]
    return []


def routes(app: Any) -> set[tuple[str, str]]:
    return {(r.method.lower(), r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}


def documented(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method, path) for path, item in document["paths"].items() for method in item if method != "parameters"}


@pytest.mark.parametrize("document", [tenant_document(), admin_document()], ids=["tenant", "admin"])
def test_every_schema_is_valid_json_schema(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1")
    found = schemas(document) + list(document["components"]["schemas"].values())
    assert len(found) > 10
    for schema in found:
        jsonschema.Draft202012Validator.check_schema(schema)


def test_the_admin_document_names_exactly_the_admin_routes() -> None:
    app = create_admin_app(object(), None)  # type: ignore[arg-type]
    assert routes(app) == documented(admin_document())
    assert ("get", OPENAPI_PATH) in routes(app)


def test_admin_routes_are_documented_for_the_admin_listener_only() -> None:
    tenant_paths = {path for _, path in documented(tenant_document())}
    assert not {p for p in tenant_paths if p.startswith("/admin")}
    served = routes(create_app(GatewayConfig(engines=["http://127.0.0.1:9"])))
    # every tenant route the app serves that is not admin is documented
    assert {r for r in served if not r[1].startswith("/admin") and r[1] != "/metrics"} <= documented(tenant_document())


@pytest.mark.asyncio
async def test_answers_match_the_served_documents(tmp_path: Any) -> None:
    """The documents each listener serves, and real answers checked against their schemas."""
    import aiohttp

    from tests.gateway.standins import MODEL, gateway_app, stand_ins

    async with stand_ins("ok") as (engine,), gateway_app([engine.url]) as (base, gateway), \
            aiohttp.ClientSession() as http:
        async with http.get(base + OPENAPI_PATH) as r:
            tenant = await r.json()
        async with http.get(gateway.admin_url + OPENAPI_PATH) as r:
            admin = await r.json()
        assert tenant in (tenant_document(), tenant_document([MODEL])) and admin == admin_document()

        def check(document: dict[str, Any], path: str, method: str, status: int, body: Any) -> None:
            responses = document["paths"][path][method]["responses"]
            schema = responses[str(status)]["content"]["application/json"]["schema"]
            jsonschema.validate(body, {**schema, "components": document["components"]},
                                cls=jsonschema.Draft202012Validator)

        async with http.post(base + "/v1/sessions") as r:
            created = await r.json()
            check(tenant, "/v1/sessions", "post", r.status, created)
        async with http.get(f"{base}/v1/sessions/{created['id']}") as r:
            check(tenant, "/v1/sessions/{session_id}", "get", r.status, await r.json())
        async with http.get(f"{base}/v1/sessions/nope") as r:
            check(tenant, "/v1/sessions/{session_id}", "get", r.status, await r.json())
        async with http.post(gateway.admin_url + "/admin/sessions", json={"tenant": None}) as r:
            check(admin, "/admin/sessions", "post", r.status, await r.json())
        async with http.post(gateway.admin_url + "/admin/engines/drain", json={"url": "x"}) as r:
            check(admin, "/admin/engines/drain", "post", r.status, await r.json())
