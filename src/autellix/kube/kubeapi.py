"""A thin async client of the Kubernetes API for the operator's children.

Built on kubernetes_asyncio's ApiClient (authentication, TLS, in-cluster or
kubeconfig) but speaking plain JSON dicts, as the manifests are built: the
operator creates, merge-patches, reads and lists objects by path.
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from autellix.kube import API_VERSION, ENGINE_KIND, ENGINE_PLURAL, PROGRAM_KIND, PROGRAM_PLURAL
from autellix.kube.diff import drifted, managed_part

#: apiVersion/kind -> plural (the kinds the operator touches).
PLURALS = {
    ("apps/v1", "Deployment"): "deployments",
    ("v1", "Service"): "services",
    ("v1", "Pod"): "pods",
    ("v1", "Event"): "events",
    ("batch/v1", "Job"): "jobs",
    ("discovery.k8s.io/v1", "EndpointSlice"): "endpointslices",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepools",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "horizontalpodautoscalers",
    ("coordination.k8s.io/v1", "Lease"): "leases",
    (API_VERSION, ENGINE_KIND): ENGINE_PLURAL,
    (API_VERSION, PROGRAM_KIND): PROGRAM_PLURAL,
}


def object_path(api_version: str, kind: str, namespace: str, name: str | None = None,
                subresource: str | None = None) -> str:
    """/api/v1/namespaces/NS/services/NAME, /apis/apps/v1/namespaces/NS/deployments, ..."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{PLURALS[(api_version, kind)]}"
    if name is not None:
        path += f"/{name}"
    if subresource is not None:
        path += f"/{subresource}"
    return path


class NotOwned(RuntimeError):
    """A child's name is taken by an object another owner (or nobody) controls."""


def controller_uid(obj: dict[str, Any]) -> str | None:
    """The uid of the object's controlling owner (the operator never takes over another's object)."""
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return next((r.get("uid") for r in refs if r.get("controller")), None)


class KubeApi:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client

    @classmethod
    async def from_environment(cls) -> KubeApi:
        """In a pod: its service account; elsewhere: the current kubeconfig context."""
        try:
            config.load_incluster_config()
        except config.ConfigException:
            await config.load_kube_config()
        return cls(client.ApiClient())

    @classmethod
    def for_server(cls, url: str) -> KubeApi:
        """An unauthenticated client of ``url`` (a local API server, the tests' emulator)."""
        configuration = client.Configuration(host=url.rstrip("/"))
        return cls(client.ApiClient(configuration))

    async def close(self) -> None:
        await self.api_client.close()

    async def request(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
                      query: list[tuple[str, str]] | None = None) -> Any:
        return await self.api_client.call_api(
            path, method, query_params=query or [], header_params={"Content-Type": content_type,
                                                                   "Accept": "application/json"},
            body=body, auth_settings=["BearerToken"], response_types_map={200: "object", 201: "object",
                                                                          202: "object"},
            _return_http_data_only=True)

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self.request("GET", path)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        query = [("labelSelector", label_selector)] if label_selector else None
        return list((await self.request("GET", path, query=query)).get("items", []))

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("POST", path, body)

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT: refused (409) when ``body``'s resourceVersion is not the live one."""
        return await self.request("PUT", path, body)

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self.request("PATCH", path, patch, content_type="application/merge-patch+json")

    async def delete(self, path: str) -> bool:
        try:
            await self.request("DELETE", path)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    async def apply(self, desired: dict[str, Any], *, create_only: bool = False) -> str:
        """Create ``desired`` or patch the live object back to it: ``created``, ``patched``, ``unchanged``
        (or ``deleting``). ``create_only`` leaves an existing object as it is (a Job's pod template is
        immutable)."""
        meta = desired["metadata"]
        api_version, kind = desired["apiVersion"], desired["kind"]
        path = object_path(api_version, kind, meta["namespace"], meta["name"])
        live = await self.get(path)
        if live is None or live.get("metadata", {}).get("deletionTimestamp"):
            if live is not None:
                return "deleting"  # the garbage collector is removing it; the DELETED event brings us back
            try:
                await self.create(object_path(api_version, kind, meta["namespace"]), desired)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                return "unchanged"  # created concurrently (e.g. by the drift watch)
            return "created"
        if controller_uid(live) != controller_uid(desired):
            raise NotOwned(f"{kind} {meta['name']!r} exists and belongs to someone else; delete or rename it")
        if create_only or not drifted(live, desired):
            return "unchanged"
        await self.merge_patch(path, managed_part(desired))
        return "patched"
