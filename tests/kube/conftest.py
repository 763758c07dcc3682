"""The operator's world with no cluster: kmock's emulator (gaps filled), kopf running
for real in-process, a real gateway in-process, and engines that report a load the
test sets."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import kopf
import pytest
import pytest_asyncio
import yaml
from aiohttp import web

from autellix.gateway.compose import create_app
from autellix.gateway.config import GatewayConfig
from autellix.gateway.parts import GATEWAY_KEY
from autellix.kube.context import OperatorConfig
from autellix.kube.endpoints import endpoint_pods
from autellix.kube.kubeapi import KubeApi
from autellix.kube.run import run_operator
from tests.kube.kmock_cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
CRDS = sorted((ROOT / "crds").glob("*.yaml"))
NAMESPACE = "default"
#: (verb, group, resource[/subresource], namespaced) of every request an operator made in this session's
#: emulated clusters (its own client's or kopf's): what tests/kube/test_rbac.py holds the chart's RBAC to.
OPERATOR_ACCESS: set[tuple[str, str, str, bool]] = set()
#: Gateway base URL -> its admin listener, for the gateways the tests start.
ADMIN_URLS: dict[str, str] = {}
#: The test modules whose operators reached OPERATOR_ACCESS.
ACCESS_FROM: set[str] = set()


def is_operator(agent: str) -> bool:
    return agent.startswith(("autellix-operator", "kopf/"))


def load_crd(kind: str) -> dict[str, Any]:
    for path in CRDS:
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            return crd
    raise LookupError(kind)


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 10.0, what: str = "") -> Any:
    """Poll ``check`` until it returns something truthy (the operator works asynchronously)."""
    deadline = asyncio.get_running_loop().time() + timeout
    last: Any = None
    while asyncio.get_running_loop().time() < deadline:
        with contextlib.suppress(AssertionError, KeyError, TypeError):
            last = await check()
            if last:
                return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or check.__name__}; last: {last!r}")


@pytest_asyncio.fixture
async def cluster(request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    async with Cluster() as emulator, kmock.Server(emulator):
        yield emulator
    access = {(verb, group, res, ns is not None) for agent, verb, group, res, ns in emulator.requests
              if is_operator(agent)}
    if access:
        OPERATOR_ACCESS.update(access)
        ACCESS_FROM.add(request.node.module.__name__.rsplit(".", 1)[-1])


@pytest_asyncio.fixture
async def api(cluster: Cluster) -> AsyncIterator[KubeApi]:
    """A client of the emulator (what kubectl is to a cluster); the CRDs are applied."""
    client = KubeApi.for_server(str(cluster.servers[0].url))
    for path in CRDS:
        await client.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", yaml.safe_load(path.read_text()))
    yield client
    await client.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def events_about(api: KubeApi, obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The Events whose involvedObject is ``obj`` (what ``kubectl describe`` lists), oldest first."""
    meta = obj["metadata"]
    found = await api.list(f"/api/v1/namespaces/{meta['namespace']}/events")
    return sorted((e for e in found if e.get("involvedObject", {}).get("uid") == meta["uid"]),
                  key=lambda e: e["metadata"]["resourceVersion"].zfill(12))


class Gateway:
    """A real gateway (the app ``autellix gateway`` serves) on a local port (any free one unless given);
    engines from a callable."""

    def __init__(self, urls: Callable[[], set[str]], port: int = 0, admin_port: int = 0) -> None:
        self._urls = urls
        self._port, self._admin_port = port, admin_port
        self.url = ""
        #: Its admin listener (engines, drain, sessions on a tenant's behalf): the operator's way in.
        self.admin_url = ""
        self.app: web.Application | None = None

    async def urls(self) -> set[str]:  # the gateway's Discovery protocol
        return self._urls()

    async def aclose(self) -> None:
        return None

    async def __aenter__(self) -> Gateway:
        self.app = create_app(GatewayConfig(discovery=self, poll_interval=0.1, admin_port=self._admin_port))
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self._port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self.admin_url = self.app[GATEWAY_KEY].admin_url or ""
        ADMIN_URLS[self.url] = self.admin_url
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._runner.cleanup()

    async def engines_healthy(self, count: int) -> bool:
        """True once the gateway has found and probed ``count`` healthy engines."""
        async with aiohttp.ClientSession() as http, http.get(f"{self.admin_url}/admin/engines") as r:
            return sum(e["healthy"] for e in (await r.json())["data"]) == count


@pytest_asyncio.fixture
async def gateway(cluster: Cluster) -> AsyncIterator[Gateway]:
    """Its engines are the ready endpoints of the engine Services' EndpointSlices in the emulator,
    as the gateway's Kubernetes discovery finds them in a cluster."""
    def urls() -> set[str]:
        slices = [obj for (res, _, _), obj in cluster._items_all() if res.plural == "endpointslices"]
        return set(endpoint_pods(slices))

    async with Gateway(urls) as gw:
        yield gw


#: Starts an operator with OperatorConfig's fields; returns what stops it (the test's end stops it otherwise).
OperatorFactory = Callable[..., Awaitable[Callable[[], Awaitable[None]]]]


@pytest_asyncio.fixture
async def operator(cluster: Cluster, api: KubeApi) -> AsyncIterator[OperatorFactory]:
    """Starts ``autellix operator`` (kopf, cluster-wide) against the emulator, in a thread with its own
    event loop: at exit kopf cancels every task its loop started after it, which must not be the
    emulator's or the gateway's."""
    started: list[tuple[threading.Thread, threading.Event, list[BaseException]]] = []
    server = str(cluster.servers[0].url)

    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=server, insecure=True)

    def tune(settings: kopf.OperatorSettings) -> None:
        settings.networking.request_timeout = 10
        settings.watching.reconnect_backoff = 0.1
        settings.queueing.exit_timeout = 2

    async def stop(thread: threading.Thread, flag: threading.Event, errors: list[BaseException]) -> None:
        flag.set()
        await asyncio.to_thread(thread.join, 15)
        assert not thread.is_alive(), "the operator did not stop"
        assert not errors, errors

    async def start(**config: Any) -> Callable[[], Awaitable[None]]:
        flag, ready, errors = threading.Event(), threading.Event(), []
        options = {"retry_backoff": 0.3, "autoscale_interval": 0.2, "program_poll_interval": 0.2,
                   "gateway_url": "http://127.0.0.1:9", **config}  # no gateway unless the test starts one
        # the operator reaches a test's gateway through its admin listener, as in the chart
        options.setdefault("gateway_admin_url", ADMIN_URLS.get(options["gateway_url"]))

        async def main() -> None:
            await run_operator(OperatorConfig(**options), api=KubeApi.for_server(server), login=login, tune=tune,
                               stop_flag=flag, ready_flag=ready)

        def run() -> None:
            try:
                asyncio.run(main())
            except BaseException as exc:  # shown by the test that started it
                errors.append(exc)
                ready.set()

        thread = threading.Thread(target=run, name="operator", daemon=True)
        thread.start()
        started.append((thread, flag, errors))
        await asyncio.to_thread(ready.wait, 30)
        if errors:
            raise errors[0]
        return lambda: stop(thread, flag, errors)

    yield start
    for thread, flag, errors in started:
        await stop(thread, flag, errors)


@pytest.fixture
def engine_path() -> Callable[..., str]:
    def path(name: str | None = None, sub: str | None = None) -> str:
        p = f"/apis/autellix.ai/v1alpha1/namespaces/{NAMESPACE}/autellixengines"
        return p + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")
    return path
