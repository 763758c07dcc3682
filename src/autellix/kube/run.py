"""Run the operator: ``autellix operator`` in a pod, or in-process in the tests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Collection
from typing import Any

import aiohttp
import kopf

from autellix.kube.gateway_client import GatewayClient
from autellix.kube.handlers import Context, OperatorConfig, build_registry, default_login, settings_for
from autellix.kube.kubeapi import KubeApi


async def run_operator(config: OperatorConfig, *, api: KubeApi | None = None, namespaces: Collection[str] = (),
                       login: Callable[..., Any] = default_login,
                       tune: Callable[[kopf.OperatorSettings], None] | None = None,
                       stop_flag: asyncio.Event | threading.Event | None = None,
                       ready_flag: asyncio.Event | threading.Event | None = None,
                       liveness_endpoint: str | None = None) -> None:
    """kopf's operator with our handlers; cluster-wide unless ``namespaces`` are given."""
    settings = kopf.OperatorSettings()
    settings_for(settings)
    if tune is not None:
        tune(settings)
    api = api or await KubeApi.from_environment()
    try:
        async with aiohttp.ClientSession() as http:
            ctx = Context(api=api, gateway=GatewayClient(http, config.gateway_api_key), config=config)
            await kopf.operator(registry=build_registry(config, login), settings=settings, memo=kopf.Memo(ctx=ctx),
                                clusterwide=not namespaces, namespaces=list(namespaces), standalone=True,
                                stop_flag=stop_flag, ready_flag=ready_flag, liveness_endpoint=liveness_endpoint)
    finally:
        await api.close()
