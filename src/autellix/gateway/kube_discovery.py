"""Engines discovered from Kubernetes: the EndpointSlices of the engines' Services.

The operator gives every engine Service the label ``app.kubernetes.io/component=engine``;
Kubernetes copies a Service's labels onto its EndpointSlices, so one label
selector finds every engine pod's address. Each ready endpoint is one engine,
``http://<pod IP>:<port named "http">``: the gateway balances over pods, not
over Services (Algorithm 2 needs to know which pod holds a program's KV cache).

``slice_urls`` is the pure part (slices in, URLs out), in ``autellix.endpointslices``
for the operator too. ``KubeDiscovery`` keeps the slices current with a list-then-watch loop (kubernetes_asyncio) in the
background and answers ``urls()`` from memory, so the pool's polling never
waits on the API server; a watch that breaks or expires re-lists.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from autellix.control.background import cancel
from autellix.endpointslices import (
    DEFAULT_ENGINE_SELECTOR,
    DEFAULT_PORT,
    DEFAULT_PORT_NAME,
    SliceKey,
    endpoint_ready,
    slice_key,
    slice_port,
    slice_urls,
)

log = logging.getLogger("autellix.gateway.kube_discovery")

__all__ = ["DEFAULT_ENGINE_SELECTOR", "DEFAULT_PORT", "DEFAULT_PORT_NAME", "KubeDiscovery", "SliceKey",
           "WatchExpired", "endpoint_ready", "slice_key", "slice_port", "slice_urls"]


class WatchExpired(Exception):
    """The API server no longer has the resourceVersion we watch from (410 Gone)."""


class KubeDiscovery:
    """The ``Discovery`` of ``autellix gateway --discovery kubernetes``.

    ``namespace`` None watches every namespace (needs a ClusterRole); a name
    watches that one (a Role). ``configuration`` is a kubernetes_asyncio
    ``Configuration``; without one, the in-cluster service account is used,
    else the local kubeconfig.
    """

    def __init__(self, selector: str = DEFAULT_ENGINE_SELECTOR, namespace: str | None = None, *,
                 port_name: str = DEFAULT_PORT_NAME, default_port: int = DEFAULT_PORT,
                 configuration: Any = None, retry_delay: float = 2.0, watch_timeout_s: int = 300,
                 first_sync_timeout: float = 10.0, user_agent: str | None = None) -> None:
        self.selector = selector
        self.namespace = namespace
        self.port_name = port_name
        self.default_port = default_port
        self.retry_delay = retry_delay
        self.watch_timeout_s = watch_timeout_s
        self.first_sync_timeout = first_sync_timeout
        self._configuration = configuration
        self.user_agent = user_agent  # who asks, in the API server's audit log
        self._slices: dict[SliceKey, dict[str, Any]] = {}
        self._synced = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._api: Any = None

    async def urls(self) -> set[str]:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kube-discovery")
            with contextlib.suppress(TimeoutError):  # an unreachable API server: empty pool, retried behind
                await asyncio.wait_for(self._synced.wait(), self.first_sync_timeout)
        return slice_urls(self._slices.values(), port_name=self.port_name, default_port=self.default_port)

    async def aclose(self) -> None:
        await cancel(self._task)
        self._task = None
        if self._api is not None:
            await self._api.close()
            self._api = None

    # ---- the list-then-watch loop ------------------------------------------------
    async def _client(self) -> Any:
        from kubernetes_asyncio import client, config

        configuration = self._configuration
        if configuration is None:
            configuration = client.Configuration()
            try:
                config.load_incluster_config(client_configuration=configuration)
            except config.ConfigException:
                await config.load_kube_config(client_configuration=configuration)
        self._api = client.ApiClient(configuration=configuration)
        if self.user_agent:
            self._api.user_agent = self.user_agent
        return client.DiscoveryV1Api(self._api)

    def _lister(self, api: Any) -> Any:
        if self.namespace:
            return lambda **kw: api.list_namespaced_endpoint_slice(self.namespace, **kw)
        return api.list_endpoint_slice_for_all_namespaces

    async def _run(self) -> None:
        where = f"namespace {self.namespace}" if self.namespace else "all namespaces"
        lister = None
        while True:
            try:
                if lister is None:
                    lister = self._lister(await self._client())
                version = await self._relist(lister)
                self._synced.set()
                log.info("watching engine EndpointSlices (%s, %s): %d engine(s)", self.selector, where,
                         len(slice_urls(self._slices.values(), port_name=self.port_name)))
                while True:
                    version = await self._watch(lister, version)
            except asyncio.CancelledError:
                raise
            except WatchExpired:
                log.info("EndpointSlice watch expired; listing again")
            except Exception as exc:  # the API server restarts, RBAC is fixed later...: keep trying
                log.warning("engine discovery failed (%r); retrying in %.0fs", exc, self.retry_delay)
                await asyncio.sleep(self.retry_delay)

    async def _relist(self, lister: Any) -> str:
        response = await lister(label_selector=self.selector, _preload_content=False)
        async with response:
            body = await response.read()
            if response.status != 200:
                raise RuntimeError(f"listing EndpointSlices: HTTP {response.status}: {body[:300]!r}")
        data = json.loads(body)
        self._slices = {slice_key(eps): eps for eps in data.get("items") or ()}
        return (data.get("metadata") or {}).get("resourceVersion") or ""

    async def _watch(self, lister: Any, version: str) -> str:
        """Apply watch events until the server ends the stream; returns the last resourceVersion."""
        response = await lister(label_selector=self.selector, watch=True, resource_version=version or None,
                                allow_watch_bookmarks=True, timeout_seconds=self.watch_timeout_s,
                                _preload_content=False, _request_timeout=self.watch_timeout_s + 30)
        async with response:
            if response.status == 410:
                raise WatchExpired
            if response.status != 200:
                text = (await response.read())[:300]
                raise RuntimeError(f"watching EndpointSlices: HTTP {response.status}: {text!r}")
            pending = b""  # events are JSON lines; a big slice's line can exceed aiohttp's readline limit
            async for chunk in response.content.iter_any():
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    if line.strip():
                        version = self.apply_event(json.loads(line)) or version
        return version

    def apply_event(self, event: Mapping[str, Any]) -> str | None:
        """One watch event into the slice cache; returns its resourceVersion, if any."""
        kind, obj = event.get("type"), event.get("object") or {}
        if not isinstance(kind, str) or not isinstance(obj, dict):
            raise RuntimeError(f"not a watch event: {str(event)[:200]}")
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise WatchExpired
            raise RuntimeError(f"EndpointSlice watch error: {obj.get('message') or obj}")
        if kind in ("ADDED", "MODIFIED"):
            self._slices[slice_key(obj)] = dict(obj)
        elif kind == "DELETED":
            self._slices.pop(slice_key(obj), None)
        return (obj.get("metadata") or {}).get("resourceVersion")
