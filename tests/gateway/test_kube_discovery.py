"""Engines discovered from Kubernetes EndpointSlices.

``slice_urls`` (slices in, URLs out) is tested directly. The watch runs for real
(kubernetes_asyncio, HTTP) against kmock's Kubernetes emulator, served from a
thread so that a gateway process can use it too. kmock 0.8 gaps filled here,
in a subclass: a watch from the Python clients (``?watch=True``) is not seen as
one, label selectors are ignored, and a watch replays the existing objects
before it subscribes to new events (so an event between the two is lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import pytest
import pytest_asyncio
from aiohttp import web
from kubernetes_asyncio.client import Configuration

from autellix.child_processes import admin_url
from autellix.gateway.engines import EnginePool
from autellix.gateway.kube_discovery import DEFAULT_ENGINE_SELECTOR, KubeDiscovery, WatchExpired, slice_urls
from tests.live import gateway, http, load_instant_engine

SLICES = "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
ENGINE_LABELS = {"app.kubernetes.io/component": "engine", "kubernetes.io/service-name": "engines"}


# ---- the pure part ----------------------------------------------------------------
def endpoint_slice(name: str, addresses: list[str | None], *, port: int | None = 8000, port_name: str = "http",
                   ready: list[bool | None] | None = None, namespace: str = "ml", address_type: str = "IPv4",
                   labels: Mapping[str, str] = ENGINE_LABELS) -> dict[str, Any]:
    """An EndpointSlice as the API server serves it; an address None is an endpoint without one."""
    ready = ready if ready is not None else [True] * len(addresses)
    endpoints = []
    for address, is_ready in zip(addresses, ready, strict=True):
        endpoint: dict[str, Any] = {"addresses": [address] if address else []}
        if is_ready is not None:
            endpoint["conditions"] = {"ready": is_ready, "serving": is_ready, "terminating": not is_ready}
        endpoints.append(endpoint)
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "addressType": address_type, "endpoints": endpoints,
        "ports": [] if port is None else [{"name": port_name, "port": port, "protocol": "TCP"}],
    }


def test_ready_endpoints_become_engine_urls() -> None:
    slices = [endpoint_slice("a", ["10.0.0.1", "10.0.0.2", "10.0.0.3"], ready=[True, False, None]),
              endpoint_slice("b", ["10.0.1.1"], port=9000)]
    # not ready (a terminating pod) is out; no condition at all reads as ready (Kubernetes' rule)
    assert slice_urls(slices) == {"http://10.0.0.1:8000", "http://10.0.0.3:8000", "http://10.0.1.1:9000"}


def test_the_port_is_the_one_named_http_else_the_default() -> None:
    named = endpoint_slice("a", ["10.0.0.1"], port=8123)
    other_name = endpoint_slice("b", ["10.0.0.2"], port=9999, port_name="metrics")
    no_ports = endpoint_slice("c", ["10.0.0.3"], port=None)
    assert slice_urls([named, other_name, no_ports]) == {
        "http://10.0.0.1:8123", "http://10.0.0.2:8000", "http://10.0.0.3:8000"}
    assert slice_urls([other_name], port_name="metrics") == {"http://10.0.0.2:9999"}
    assert slice_urls([no_ports], default_port=7000) == {"http://10.0.0.3:7000"}


def test_ipv6_addresses_are_bracketed_and_endpoints_without_address_skipped() -> None:
    v6 = endpoint_slice("a", ["fd00::7"], address_type="IPv6")
    empty = endpoint_slice("b", [None])
    assert slice_urls([v6, empty]) == {"http://[fd00::7]:8000"}
    assert slice_urls([]) == set()
    assert slice_urls([{"addressType": "IPv4", "endpoints": None, "ports": None}]) == set()


def test_one_url_per_endpoint_even_with_several_addresses() -> None:
    eps = endpoint_slice("a", ["10.0.0.1"])
    eps["endpoints"][0]["addresses"] = ["10.0.0.1", "10.0.0.9"]
    assert slice_urls([eps]) == {"http://10.0.0.1:8000"}


def test_watch_events_update_the_slices_and_errors_are_raised() -> None:
    discovery = KubeDiscovery()
    eps = endpoint_slice("a", ["10.0.0.1"])
    eps["metadata"]["resourceVersion"] = "41"
    assert discovery.apply_event({"type": "ADDED", "object": eps}) == "41"
    assert discovery.apply_event({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "42"}}}) == "42"
    assert slice_urls(discovery._slices.values()) == {"http://10.0.0.1:8000"}
    discovery.apply_event({"type": "DELETED", "object": eps})
    assert discovery._slices == {}
    with pytest.raises(WatchExpired):
        discovery.apply_event({"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}})
    with pytest.raises(RuntimeError, match="not a watch event"):
        discovery.apply_event({"items": []})  # a list answered where a watch was asked for


# ---- kmock, with the gaps the watch needs filled --------------------------------
def matches(selector: str, labels: Mapping[str, str]) -> bool:
    """Equality-based label selectors (``a=b,c!=d,e,!f``): all the tests use."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _selected(request: kmock.Request, obj: Mapping[str, Any]) -> bool:
    return matches(request.params.get("labelSelector", ""), (obj.get("metadata") or {}).get("labels") or {})


class SelectingEmulator(kmock.KubernetesEmulator):
    async def _handle(self, request: kmock.Request) -> web.StreamResponse:
        if request.method == kmock.method.GET and request.params.get("watch", "").lower() == "true":
            object.__setattr__(request, "action", kmock.action.WATCH)  # frozen attrs: kmock wants "true" only
        return await super()._handle(request)

    async def _serve_list(self, request: kmock.Request) -> kmock.Payload:
        listed = await super()._serve_list(request)
        return {**listed, "items": [o for o in listed["items"] if _selected(request, o)]}  # type: ignore[index]

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[kmock.Payload]:
        yield b""  # headers out: the client sees a stream start
        assert request.resource is not None
        bus = self._buses[request.resource]
        async with self._lock:  # subscribe first, then replay: no event falls in between
            mark = await bus.mark()
            current = [o.raw for (res, ns, _), o in self.objects.items()
                       if res == request.resource and not o.deleted and request.namespace in (None, ns)]
        try:
            for raw in current:
                if _selected(request, raw):
                    yield {"type": "ADDED", "object": raw}
            async for event in bus.stream(since=mark):
                raw = event.get("object") or {}
                namespace = (raw.get("metadata") or {}).get("namespace")
                if request.namespace in (None, namespace) and _selected(request, raw):
                    yield event
        finally:
            await bus.unmark(mark)


class ThreadedEmulator:
    """The emulator on a port of its own, in a thread with its own event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.url = ""
        self.emulator: SelectingEmulator | None = None
        self._stack = contextlib.AsyncExitStack()

    async def _start(self) -> None:
        self.emulator = emulator = await self._stack.enter_async_context(SelectingEmulator())
        emulator.resources["discovery.k8s.io/v1/endpointslices"] = kmock.ResourceInfo(
            namespaced=True, kind="EndpointSlice", verbs={"list", "watch", "get", "create", "patch", "delete"})
        server = await self._stack.enter_async_context(kmock.Server(emulator))
        self.url = str(server.url).rstrip("/")

    def start(self) -> ThreadedEmulator:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._stack.aclose(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def configuration(self) -> Configuration:
        return Configuration(host=self.url)

    def reads(self, action: kmock.action) -> int:
        """EndpointSlice lists or watches served so far."""
        return sum(1 for r in self.emulator or () if r.action == action and r.resource is not None
                   and r.resource.plural == "endpointslices")


@pytest.fixture(scope="module")
def emulator() -> Iterator[ThreadedEmulator]:
    started = ThreadedEmulator().start()
    try:
        yield started
    finally:
        started.stop()


def kubectl(emulator: ThreadedEmulator, method: str, eps: Mapping[str, Any]) -> None:
    """Create (POST), change (PATCH) or delete (DELETE) a slice through the API, as Kubernetes would."""
    ns, name = eps["metadata"]["namespace"], eps["metadata"]["name"]
    url = emulator.url + SLICES.format(ns=ns) + ("" if method == "POST" else f"/{name}")
    status, body = http(method, url, None if method == "DELETE" else eps,
                        headers={"Content-Type": "application/merge-patch+json"} if method == "PATCH" else None)
    assert status in (200, 201), body


async def eventually(check: Callable[[], Awaitable[bool]], what: str, limit: float = 15.0) -> None:
    deadline = time.monotonic() + limit
    while not await check():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.02)


@pytest_asyncio.fixture
async def two_engines() -> AsyncIterator[list[int]]:
    """Two experiments/instant_engine.py engines on 127.0.0.1; yields their ports."""
    instant = load_instant_engine()
    runners, ports = [], []
    for _ in range(2):
        runner = web.AppRunner(instant.create_app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    try:
        yield ports
    finally:
        for runner in runners:
            await runner.cleanup()


@pytest.mark.asyncio
async def test_engines_join_and_leave_the_pool_live(emulator: ThreadedEmulator, two_engines: list[int]) -> None:
    a_port, b_port = two_engines
    a, b = f"http://127.0.0.1:{a_port}", f"http://127.0.0.1:{b_port}"
    eps_a = endpoint_slice("engines-a", ["127.0.0.1"], port=a_port)
    eps_b = endpoint_slice("engines-b", ["127.0.0.1"], port=b_port)
    kubectl(emulator, "POST", eps_a)
    # never engines: another component's slice in the namespace, an engine slice in another namespace
    kubectl(emulator, "POST", endpoint_slice("web", ["10.9.9.9"], labels={"app.kubernetes.io/component": "web"}))
    kubectl(emulator, "POST", endpoint_slice("engines-x", ["10.8.8.8"], namespace="elsewhere"))
    discovery = KubeDiscovery(DEFAULT_ENGINE_SELECTOR, "ml", configuration=emulator.configuration(),
                              retry_delay=0.1)
    async with aiohttp.ClientSession() as session:
        pool = EnginePool(discovery, session, poll_interval=0.05)

        async def pool_is(*expected: str) -> bool:
            await pool.refresh()
            return set(pool.engines) == set(expected) and all(e.healthy for e in pool.engines.values())

        lists = emulator.reads(kmock.action.LIST)
        try:
            await pool.refresh()  # the first call lists: engine A is there at once
            assert set(pool.engines) == {a} and pool.engines[a].healthy
            kubectl(emulator, "POST", eps_b)  # a pod of a second engine became ready
            await eventually(lambda: pool_is(a, b), "engine B joined")
            kubectl(emulator, "PATCH", {**eps_a, "endpoints": [
                {"addresses": ["127.0.0.1"], "conditions": {"ready": False, "terminating": True}}]})
            await eventually(lambda: pool_is(b), "engine A left when its pod stopped being ready")
            kubectl(emulator, "DELETE", eps_b)
            await eventually(lambda: pool_is(), "engine B left with its slice")
            kubectl(emulator, "PATCH", eps_a)  # A ready again
            await eventually(lambda: pool_is(a), "engine A came back")
            # every change came by the one watch: one list, no re-list after a broken watch
            assert emulator.reads(kmock.action.LIST) == lists + 1
            assert emulator.reads(kmock.action.WATCH) >= 1
        finally:
            await pool.stop()  # closes the discovery's watch too
            for eps in (eps_a, endpoint_slice("web", []), endpoint_slice("engines-x", [], namespace="elsewhere")):
                kubectl(emulator, "DELETE", eps)


@pytest.mark.asyncio
async def test_all_namespaces_and_an_unreachable_api_server(emulator: ThreadedEmulator) -> None:
    first = endpoint_slice("engines-1", ["10.0.0.1"], namespace="team-1")
    second = endpoint_slice("engines-2", ["10.0.0.2"], namespace="team-2")
    for eps in (first, second):
        kubectl(emulator, "POST", eps)
    everywhere = KubeDiscovery(configuration=emulator.configuration(), retry_delay=0.1)
    try:
        assert await everywhere.urls() == {"http://10.0.0.1:8000", "http://10.0.0.2:8000"}
    finally:
        await everywhere.aclose()
        for eps in (first, second):
            kubectl(emulator, "DELETE", eps)
    # nothing listens there: an empty pool, not an exception, and it keeps retrying
    gone = KubeDiscovery(configuration=Configuration(host="http://127.0.0.1:9"), retry_delay=0.05,
                         first_sync_timeout=0.5)
    try:
        assert await gone.urls() == set()
        assert gone._task is not None and not gone._task.done()
    finally:
        await gone.aclose()


def test_gateway_discovers_engines_from_kubernetes(emulator: ThreadedEmulator, tmp_path: Path) -> None:
    """``autellix gateway --discovery kubernetes``, configured by a kubeconfig, as outside a cluster."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: kmock\n"
        f"clusters: [{{name: kmock, cluster: {{server: '{emulator.url}'}}}}]\n"
        "users: [{name: tester, user: {token: not-checked}}]\n"
        "contexts: [{name: kmock, context: {cluster: kmock, user: tester}}]\n")
    loop = asyncio.new_event_loop()
    instant = load_instant_engine()
    runner = web.AppRunner(instant.create_app())
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    eps = endpoint_slice("engines-gw", ["127.0.0.1"], port=port)
    kubectl(emulator, "POST", eps)
    try:
        with gateway([], "--discovery", "kubernetes", "--namespace", "ml",
                     env={"KUBECONFIG": str(kubeconfig), "KUBERNETES_SERVICE_HOST": ""}) as base:
            status, listed = http("GET", admin_url(base) + "/admin/engines")
            assert status == 200 and [e["url"] for e in listed["data"]] == [f"http://127.0.0.1:{port}"]
            status, answer = http("POST", base + "/v1/chat/completions", {
                "model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]})
            assert status == 200 and answer["choices"][0]["message"]["content"] == "ok"
    finally:
        kubectl(emulator, "DELETE", eps)
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
