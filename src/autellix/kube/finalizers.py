"""The way out for resources an older operator finalized, when no operator runs to release them.

The operator sets no finalizer; its older versions put kopf's finalizer
``autellix.ai/finalizer`` on AgentPrograms whose session was open (and, earlier
still, on AutellixEngines), and a running operator drops it wherever it finds
it. With no operator running, deleting such a resource waits forever, and so
does deleting the CRDs or the namespace. ``release_finalizers`` removes that
finalizer from the resources already being deleted, so they go; the sessions
they held end in the gateway by its idle TTL (``program_idle_ttl``). Other
finalizers are left as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from autellix.kube import API_VERSION, ENGINE_KIND, ENGINE_PLURAL, FINALIZER, PROGRAM_KIND, PROGRAM_PLURAL
from autellix.kube.kubeapi import KubeApi, object_path

KINDS = ((ENGINE_KIND, ENGINE_PLURAL), (PROGRAM_KIND, PROGRAM_PLURAL))


@dataclass(frozen=True)
class Released:
    kind: str
    namespace: str
    name: str


def release_patch(obj: dict[str, Any], *, deleting_only: bool = True) -> dict[str, Any] | None:
    """The merge patch that drops the operator's finalizer from ``obj`` (None: nothing to drop). The
    resourceVersion makes it refused (409) if the object changed since it was read."""
    meta = obj.get("metadata", {})
    finalizers = list(meta.get("finalizers") or [])
    if FINALIZER not in finalizers or (deleting_only and not meta.get("deletionTimestamp")):
        return None
    return {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                         "finalizers": [f for f in finalizers if f != FINALIZER]}}


async def release_finalizers(api: KubeApi, namespace: str | None, *, deleting_only: bool = True,
                             attempts: int = 3) -> list[Released]:
    """Drop the operator's finalizer from the AutellixEngines and AgentPrograms of ``namespace`` (None:
    every namespace) that are being deleted (``deleting_only=False``: from all of them); returns those
    released. A kind whose CRD is gone has nothing to release."""
    released: list[Released] = []
    for kind, plural in KINDS:
        path = f"/apis/{API_VERSION}/" + (f"namespaces/{namespace}/{plural}" if namespace else plural)
        try:
            objects = await api.list(path)
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise
        for obj in objects:
            meta = obj["metadata"]
            if await _release_one(api, object_path(API_VERSION, kind, meta["namespace"], meta["name"]), obj,
                                  deleting_only, attempts):
                released.append(Released(kind, meta["namespace"], meta["name"]))
    return released


async def _release_one(api: KubeApi, path: str, obj: dict[str, Any] | None, deleting_only: bool,
                       attempts: int) -> bool:
    for _ in range(attempts):
        if obj is None:
            return False  # gone meanwhile
        patch = release_patch(obj, deleting_only=deleting_only)
        if patch is None:
            return False
        try:
            await api.merge_patch(path, patch)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            if exc.status != 409:
                raise
        obj = await api.get(path)  # changed since it was read: read it again
    raise RuntimeError(f"{path} kept changing; run the command again")
