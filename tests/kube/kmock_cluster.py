"""kmock's Kubernetes emulator with the gaps of kmock 0.8 filled, for kopf to run against.

kmock 0.8 serves discovery and keeps objects, but: posting a CRD does not
register its resource; objects get no uid, resourceVersion, creationTimestamp
and no namespace from the URL; a failed JSON-patch ``test`` answers 500, not
422; a watch replays objects before subscribing (events in between are lost)
and ignores ``resourceVersion``; ``?watch=True`` (Python clients) is not a
watch; label/field selectors are ignored; PUT is unsupported; nothing is
garbage-collected. ``Cluster`` keeps kmock's server, request parsing,
discovery, error rendering and object store (``cluster.objects``), and serves
object reads and writes itself:

* every write bumps one cluster-wide resourceVersion and appends the event to
  a log; a watch streams the log from the requested resourceVersion (or lists
  first when none is given), so nothing falls between list and watch;
* JSON patches with a failing ``test`` answer 422 (kopf then retries);
  merge patches follow RFC 7386; PUT replaces (409 on a stale resourceVersion);
* the status subresource: ``/status`` writes only status, the main resource
  ignores status when the resource has the subresource; ``/scale`` reads and
  writes spec.replicas;
* deletion honours finalizers (deletionTimestamp first) and then collects the
  objects whose ownerReferences name the deleted uid, as the garbage collector,
  which also takes an object created later whose owners are all gone;
* ``/scale`` follows the CRD's scale paths (``labelSelectorPath``: the HPA's selector);
* every object request is recorded (``requests``) with its User-Agent and RBAC
  verb, plus the ``update`` on the owner's finalizers the API server requires
  of a ``blockOwnerDeletion`` owner reference: what ``test_rbac.py`` checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import re
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import aiohttp.web
import jsonpatch
import jsonpointer
import kmock
from kmock._internal import apps, rendering

Key = tuple[kmock.resource, str | None, str]

VERBS = {"list", "watch", "get", "create", "patch", "update", "delete"}
#: Built-in kinds the operator and kopf use: (group/version/plural, kind, namespaced).
BUILTINS = [
    ("v1/pods", "Pod", True),
    ("v1/services", "Service", True),
    ("v1/events", "Event", True),
    ("v1/namespaces", "Namespace", False),
    ("apps/v1/deployments", "Deployment", True),
    ("batch/v1/jobs", "Job", True),
    ("discovery.k8s.io/v1/endpointslices", "EndpointSlice", True),
    ("policy/v1/poddisruptionbudgets", "PodDisruptionBudget", True),
    ("autoscaling/v2/horizontalpodautoscalers", "HorizontalPodAutoscaler", True),
    ("coordination.k8s.io/v1/leases", "Lease", True),
    ("apiextensions.k8s.io/v1/customresourcedefinitions", "CustomResourceDefinition", False),
]
CRD = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return patch
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _requirements(selector: str) -> Iterator[tuple[str, str, set[str]]]:
    """(key, operator, values) of a label selector: =, ==, !=, in, notin, exists, !exists."""
    for part in re.findall(r"[^,(]+(?:\([^)]*\))?", selector):
        part = part.strip()
        if not part:
            continue
        if m := re.fullmatch(r"([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)", part):
            yield m[1], m[2], {v.strip() for v in m[3].split(",") if v.strip()}
        elif m := re.fullmatch(r"([^\s!=]+)\s*(==|=|!=)\s*(\S*)", part):
            yield m[1], "!=" if m[2] == "!=" else "=", {m[3]}
        elif part.startswith("!"):
            yield part[1:].strip(), "!exists", set()
        else:
            yield part, "exists", set()


def selected(labels: Mapping[str, str], selector: str | None) -> bool:
    for key, op, values in _requirements(selector or ""):
        present, value = key in labels, labels.get(key)
        ok = {"=": present and value in values, "!=": not present or value not in values,
              "in": present and value in values, "notin": not present or value not in values,
              "exists": present, "!exists": not present}[op]
        if not ok:
            return False
    return True


def field_selected(obj: Mapping[str, Any], selector: str | None) -> bool:
    for part in (selector or "").split(","):
        if m := re.fullmatch(r"\s*([\w.]+)\s*(==|=|!=)\s*(\S*)\s*", part):
            value: Any = obj
            for step in m[1].split("."):
                value = value.get(step) if isinstance(value, Mapping) else None
            if (str(value or "") == m[3]) == (m[2] == "!="):
                return False
    return True


def verb_of(method: str, name: str | None, watching: bool) -> str:
    """The RBAC verb of a request, as the API server names it."""
    if watching:
        return "watch"
    if method == "GET":
        return "get" if name else "list"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, method.lower())


def _fail(status: int, reason: str, message: str) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=status, reason=reason, message=message, details={})


class Cluster(kmock.KubernetesEmulator):
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.revision = 0
        self.log: list[tuple[int, kmock.resource, dict[str, Any]]] = []
        self.changed = asyncio.Condition()
        self.subresources: dict[kmock.resource, set[str]] = {}
        self.scale_paths: dict[kmock.resource, dict[str, str]] = {}
        #: Every object request: (User-Agent, verb, group, resource[/subresource], namespace or None).
        self.requests: list[tuple[str, str, str, str, str | None]] = []
        for path, kind, namespaced in BUILTINS:
            self.resources[path] = kmock.ResourceInfo(kind=kind, singular=kind.lower(), namespaced=namespaced,
                                                      verbs=VERBS)

    # ---- the store ---------------------------------------------------------------------
    def get(self, resource: kmock.resource | str, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (kmock.resource(resource), namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return json.loads(json.dumps(self.objects[key].last.raw))

    def _items(self, resource: kmock.resource) -> list[tuple[Key, dict[str, Any]]]:
        return [(key, obj.last.raw) for key, obj in self.objects.items()
                if key[0] == resource and not obj.deleted]

    def _kind(self, resource: kmock.resource) -> str:
        info = self.resources[resource] if resource in self.resources else None  # noqa: SIM401 ([] creates one)
        return (info.kind if info and info.kind else resource.plural.capitalize())

    async def _emit(self, resource: kmock.resource, type_: str, obj: dict[str, Any]) -> None:
        async with self.changed:
            self.log.append((self.revision, resource, {"type": type_, "object": obj}))
            self.changed.notify_all()

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.revision += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.revision)
        return obj

    def _store(self, key: Key, obj: dict[str, Any]) -> None:
        if key in self.objects:
            self.objects[key].create(obj)  # a new version in kmock's history
        else:
            self.objects[key] = obj

    def _register_crd(self, crd: dict[str, Any]) -> None:
        spec = crd["spec"]
        for version in spec.get("versions", []):
            res = kmock.resource(spec["group"], version["name"], spec["names"]["plural"])
            subresources = set(version.get("subresources") or {})
            self.resources[res] = kmock.ResourceInfo(
                kind=spec["names"]["kind"], singular=spec["names"].get("singular"),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced", verbs=VERBS,
                shortnames=set(spec["names"].get("shortNames") or []), subresources=subresources)
            self.subresources[res] = subresources
            self.scale_paths[res] = (version.get("subresources") or {}).get("scale") or {}

    # ---- writes ------------------------------------------------------------------------
    async def create(self, resource: kmock.resource, namespace: str | None, body: dict[str, Any]) -> dict[str, Any]:
        meta = body.setdefault("metadata", {})
        namespace = namespace or meta.get("namespace")
        name = meta.get("name") or (meta.get("generateName", "") + uuid.uuid4().hex[:5])
        if not name:
            raise _fail(422, "Invalid", "metadata.name: Required value")
        key = (resource, namespace, name)
        if key in self.objects and not self.objects[key].deleted:
            raise _fail(409, "AlreadyExists", f'{resource.plural} "{name}" already exists')
        meta.update(name=name, uid=str(uuid.uuid4()), generation=1,
                    creationTimestamp=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        if namespace is not None:
            meta["namespace"] = namespace
        meta.pop("deletionTimestamp", None)
        body.setdefault("apiVersion", f"{resource.group}/{resource.version}" if resource.group else resource.version)
        body.setdefault("kind", self._kind(resource))
        self._bump(body)
        self._store(key, body)
        if resource == CRD:
            self._register_crd(body)
        await self._emit(resource, "ADDED", body)
        owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
        if owners and not owners & {obj["metadata"].get("uid") for _, obj in self._items_all()}:
            # The garbage collector also takes an object made after its owner went (a controller that read
            # the owner just before its deletion): its owner references name no object.
            await self._remove(resource, namespace, name)
        return body

    async def write(self, resource: kmock.resource, namespace: str | None, name: str, new: dict[str, Any],
                    subresource: str | None = None) -> dict[str, Any]:
        """Store a changed object (after a patch or a put) and finish a deletion it unblocks."""
        old = self.get(resource, namespace, name)
        assert old is not None
        has_status = "status" in self.subresources.get(resource, set())
        if subresource == "status":
            new = {**old, "status": new.get("status", {})}
        elif has_status:
            new = {**new, "status": old.get("status")} if "status" in old else \
                {k: v for k, v in new.items() if k != "status"}
        for fixed in ("uid", "creationTimestamp", "name", "namespace"):
            if fixed in old["metadata"]:
                new.setdefault("metadata", {})[fixed] = old["metadata"][fixed]
        if old["metadata"].get("deletionTimestamp"):
            new["metadata"]["deletionTimestamp"] = old["metadata"]["deletionTimestamp"]
        if new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        self._bump(new)
        self._store((resource, namespace, name), new)
        await self._emit(resource, "MODIFIED", new)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            await self._remove(resource, namespace, name)
        return new

    async def delete(self, resource: kmock.resource, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self.get(resource, namespace, name)
        if obj is None:
            raise _fail(404, "NotFound", f'{resource.plural} "{name}" not found')
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = datetime.datetime.now(datetime.UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ")
                self._bump(obj)
                self._store((resource, namespace, name), obj)
                await self._emit(resource, "MODIFIED", obj)
            return obj
        return await self._remove(resource, namespace, name)

    async def _remove(self, resource: kmock.resource, namespace: str | None, name: str) -> dict[str, Any]:
        key = (resource, namespace, name)
        obj = self.get(resource, namespace, name)
        assert obj is not None
        self._bump(obj)
        self.objects[key].delete()
        await self._emit(resource, "DELETED", obj)
        # The garbage collector: dependents of the deleted uid go too (background propagation).
        uid = obj["metadata"].get("uid")
        for (res, ns, dep_name), dependent in list(self._items_all()):
            owners = dependent.get("metadata", {}).get("ownerReferences") or []
            if any(ref.get("uid") == uid for ref in owners) and self.get(res, ns, dep_name) is not None:
                await self.delete(res, ns, dep_name)
        return obj

    def _items_all(self) -> list[tuple[Key, dict[str, Any]]]:
        return [(key, obj.last.raw) for key, obj in self.objects.items() if not obj.deleted]

    # ---- HTTP --------------------------------------------------------------------------
    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        if resource is None or resource.plural is None:
            return await apps.RawHandler._handle(self, request)  # discovery: kmock's own
        method = request.method.upper()
        params = request.params
        ns, name, sub = request.namespace, request.name, request.subresource
        watching = method == "GET" and str(params.get("watch", "")).lower() in ("true", "1")
        self._record(request, verb_of(method, name, watching), resource, sub, ns)
        if watching:
            return await self._watch(request)
        async with self._lock:
            if method == "GET" and name is None:
                return self._json(self._list(resource, ns, params))
            if method == "POST" and name is None:
                return self._json(await self.create(resource, ns, dict(request.data or {})), 201)
            if name is None:
                raise _fail(405, "MethodNotAllowed", f"{method} on a collection")
            obj = self.get(resource, ns, name)
            if obj is None:
                raise _fail(404, "NotFound", f'{resource.plural} "{name}" not found')
            if sub and resource in self.subresources and sub not in self.subresources[resource]:
                raise _fail(404, "NotFound", f"{resource.plural} has no {sub} subresource")
            if method == "GET":
                return self._json(self._scale(obj, resource) if sub == "scale" else obj)
            if method == "DELETE":
                return self._json(await self.delete(resource, ns, name))
            if method == "PATCH":
                new = self._patched(obj, request, sub)
            elif method == "PUT":
                new = dict(request.data or {})
                wanted = new.get("metadata", {}).get("resourceVersion")
                if wanted and wanted != obj["metadata"]["resourceVersion"]:
                    raise _fail(409, "Conflict", "the object has been modified; please apply your changes "
                                                 "to the latest version and try again")
                if sub == "scale":
                    new = merge_patch(obj, {"spec": {"replicas": new.get("spec", {}).get("replicas")}})
            else:
                raise _fail(405, "MethodNotAllowed", method)
            new = await self.write(resource, ns, name, new, subresource=sub if sub == "status" else None)
            return self._json(self._scale(new, resource) if sub == "scale" else new)

    def _record(self, request: rendering.Request, verb: str, resource: kmock.resource, sub: str | None,
                ns: str | None) -> None:
        agent = request.headers.get("User-Agent", "")
        plural = resource.plural + (f"/{sub}" if sub else "")
        self.requests.append((agent, verb, resource.group or "", plural, ns))
        # The API server's OwnerReferencesPermissionEnforcement: setting an owner reference with
        # blockOwnerDeletion needs `update` on the owner's finalizers.
        if verb in ("create", "update", "patch") and isinstance(request.data, Mapping):
            for ref in (request.data.get("metadata") or {}).get("ownerReferences") or []:
                if ref.get("blockOwnerDeletion"):
                    group = ref.get("apiVersion", "").rpartition("/")[0]
                    owner = next((r.plural for r in self.resources if r.group == group and
                                  self._kind(r) == ref.get("kind")), ref.get("kind", "").lower() + "s")
                    self.requests.append((agent, "update", group, f"{owner}/finalizers", ns))

    def _patched(self, obj: dict[str, Any], request: rendering.Request, sub: str | None) -> dict[str, Any]:
        content_type = request.headers.get("Content-Type", "")
        patch = request.data
        if sub == "scale":
            patch = {"spec": {"replicas": (patch or {}).get("spec", {}).get("replicas")}}
        if "json-patch" in content_type:
            try:
                return jsonpatch.apply_patch(obj, patch, in_place=False)
            except jsonpatch.JsonPatchTestFailed as exc:
                raise _fail(422, "Invalid", f"the test operation failed: {exc}") from None
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
                raise _fail(422, "Invalid", str(exc)) from None
        if not isinstance(patch, Mapping):
            raise _fail(400, "BadRequest", "a merge patch must be a JSON object")
        return merge_patch(obj, patch)

    def _scale(self, obj: dict[str, Any], resource: kmock.resource) -> dict[str, Any]:
        """The Scale the API server builds from the CRD's scale paths (labelSelectorPath: the HPA's pods)."""
        meta, paths = obj["metadata"], self.scale_paths.get(resource, {})

        def at(path: str | None) -> Any:
            value: Any = obj
            for step in (path or "").strip(".").split("."):
                value = value.get(step) if isinstance(value, Mapping) and step else None
            return value

        status: dict[str, Any] = {"replicas": at(paths.get("statusReplicasPath")) or 0}
        if paths.get("labelSelectorPath") and at(paths["labelSelectorPath"]):
            status["selector"] = at(paths["labelSelectorPath"])
        return {"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": meta["name"], "namespace": meta.get("namespace"),
                             "resourceVersion": meta["resourceVersion"]},
                "spec": {"replicas": at(paths.get("specReplicasPath", ".spec.replicas")) or 0},
                "status": status}

    def _matches(self, obj: dict[str, Any], ns: str | None, name: str | None, params: Mapping[str, str]) -> bool:
        meta = obj.get("metadata", {})
        return ((ns is None or meta.get("namespace") == ns) and (name is None or meta.get("name") == name)
                and selected(meta.get("labels") or {}, params.get("labelSelector"))
                and field_selected(obj, params.get("fieldSelector")))

    def _list(self, resource: kmock.resource, ns: str | None, params: Mapping[str, str]) -> dict[str, Any]:
        items = [obj for _, obj in self._items(resource) if self._matches(obj, ns, None, params)]
        return {"apiVersion": "v1", "kind": f"{self._kind(resource)}List",
                "metadata": {"resourceVersion": str(self.revision)}, "items": items}

    async def _watch(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        resource, ns, name, params = request.resource, request.namespace, request.name, request.params
        assert resource is not None
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)
        since = params.get("resourceVersion") or ""
        async with self.changed:
            if since in ("", "0"):  # no version: the current state first, as the API server does
                start_rv = self.revision
                first = [{"type": "ADDED", "object": obj} for _, obj in self._items(resource)
                         if self._matches(obj, ns, name, params)]
            else:
                start_rv, first = int(since), []
            position = next((i for i, (rv, _, _) in enumerate(self.log) if rv > start_rv), len(self.log))
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        transport = request._raw_request.transport
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            for event in first:
                await response.write(json.dumps(event).encode() + b"\n")
            while True:
                async with self.changed:
                    if position >= len(self.log):
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(0.5):
                                await self.changed.wait()
                    batch, position = self.log[position:], len(self.log)
                # aiohttp does not cancel a handler when its client goes: look every half second
                if transport is None or transport.is_closing():
                    break
                if deadline is not None and loop.time() >= deadline:
                    break
                for _, res, event in batch:
                    if res == resource and self._matches(event["object"], ns, name, params):
                        await response.write(json.dumps(event).encode() + b"\n")
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response

    @staticmethod
    def _json(body: dict[str, Any], status: int = 200) -> aiohttp.web.Response:
        return aiohttp.web.json_response(body, status=status)
