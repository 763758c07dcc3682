"""Leader election on a coordination.k8s.io Lease, as Kubernetes' own controllers do it.

Several operator replicas run; the one holding the Lease runs kopf, the others
wait. The holder renews the Lease every ``retry_period`` seconds; a candidate
takes it over once it has seen the same record, unchanged, for
``lease_duration`` seconds of its own clock (no clock comparison between pods),
so a crashed holder is replaced within ``lease_duration + retry_period``. A
holder that cannot renew within ``renew_deadline`` stops reconciling and exits
(its pod restarts as a candidate): two replicas never reconcile at once as long
as ``renew_deadline < lease_duration``. A holder that stops on SIGTERM (a
rolling update) hands the Lease back, and a candidate takes it at its next try.

Why not kopf's peering: it needs kopf's own CRDs and cluster objects, and two
replicas of the same priority both pause; a Lease is a built-in object that a
namespaced Role covers. The chart makes the Lease (so ``helm uninstall`` removes it)
and grants ``get`` and ``update`` on that one object; a candidate creates the Lease
only where it may (a laptop's kubeconfig), else it waits for it.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

from kubernetes_asyncio.client.exceptions import ApiException

from autellix.kube.kubeapi import KubeApi, object_path

log = logging.getLogger("autellix.kube.leader")

Action = Literal["create", "renew", "take", "wait"]


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    #: This replica (its pod's name).
    identity: str
    #: A crashed holder is replaced after at most lease_duration + 2 * retry_period (10 s).
    lease_duration: float = 8.0
    #: A holder that has not renewed for this long gives up (below lease_duration, with time to stop kopf).
    renew_deadline: float = 5.0
    retry_period: float = 1.0


@dataclass(frozen=True)
class Observation:
    """The Lease record a candidate last saw, and when it first saw it (its own monotonic clock)."""

    record: tuple[str, str, str]
    since: float


def record_of(lease: dict[str, Any]) -> tuple[str, str, str]:
    spec = lease.get("spec") or {}
    return (str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or ""),
            str(lease.get("metadata", {}).get("resourceVersion") or ""))


def decide(lease: dict[str, Any] | None, identity: str, seen: Observation | None, now: float,
           lease_duration: float) -> Action:
    """What this replica does with the Lease as it is now (pure)."""
    if lease is None:
        return "create"
    holder = (lease.get("spec") or {}).get("holderIdentity") or ""
    if holder == identity:
        return "renew"
    if not holder:
        return "take"  # handed back
    if seen is not None and seen.record == record_of(lease) and now - seen.since >= lease_duration:
        return "take"  # not renewed for a whole lease duration: its holder is gone
    return "wait"


def micro_time(now: datetime.datetime | None = None) -> str:
    return (now or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_spec(previous: dict[str, Any] | None, identity: str, lease_duration: float, taking: bool) -> dict[str, Any]:
    """The Lease's spec once ``identity`` holds it (taking it over or renewing it)."""
    spec = dict((previous or {}).get("spec") or {})
    now = micro_time()
    spec.update(holderIdentity=identity, leaseDurationSeconds=int(lease_duration), renewTime=now)
    if taking:
        spec["acquireTime"] = now
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if previous else 0)
    return spec


class LeaseMissing(RuntimeError):
    """The Lease is absent and the operator's RBAC lets it update the Lease, not create it."""


class LeaderElector:
    def __init__(self, api: KubeApi, config: LeaseConfig) -> None:
        self.api = api
        self.config = config
        self.path = object_path("coordination.k8s.io/v1", "Lease", config.namespace, config.name)
        self._seen: Observation | None = None

    async def try_once(self) -> bool:
        """One attempt to hold the Lease (create, take over or renew it); True while this replica holds it."""
        config = self.config
        lease = await self.api.get(self.path)
        now = time.monotonic()
        if lease is not None and (self._seen is None or self._seen.record != record_of(lease)):
            self._seen = Observation(record_of(lease), now)
        action = decide(lease, config.identity, self._seen, now, config.lease_duration)
        if action == "wait":
            return False
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": config.name, "namespace": config.namespace},
                "spec": lease_spec(lease, config.identity, config.lease_duration, taking=action != "renew")}
        try:
            if action == "create":
                await self.api.create(self.path.rsplit("/", 1)[0], body)
            else:  # a PUT with the version read: of two candidates, one wins, the other gets 409
                assert lease is not None
                body["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
                await self.api.replace(self.path, body)
        except ApiException as exc:
            if exc.status in (409, 422):
                return False
            if exc.status == 403 and action == "create":
                raise LeaseMissing(f"Lease {config.namespace}/{config.name} does not exist and this operator may "
                                   "not create it (the chart makes it: helm upgrade puts it back)") from None
            raise
        if action != "renew":
            log.info("leader election: %s holds Lease %s/%s", config.identity, config.namespace, config.name)
        return True

    async def acquire(self) -> None:
        """Wait until this replica holds the Lease."""
        log.info("leader election: %s waits for Lease %s/%s", self.config.identity, self.config.namespace,
                 self.config.name)
        missing = False
        while True:
            try:
                if await self.try_once():
                    return
            except LeaseMissing as exc:
                if not missing:  # said once: it waits for the Lease to come back
                    log.error("leader election: %s", exc)
                missing = True
            except (ApiException, OSError) as exc:
                log.warning("leader election: %s", exc)
            await asyncio.sleep(self.config.retry_period)

    async def hold(self) -> None:
        """Renew the Lease until a renewal has not succeeded for ``renew_deadline`` seconds; then return
        (leadership is lost)."""
        last = time.monotonic()
        while time.monotonic() - last < self.config.renew_deadline:
            await asyncio.sleep(self.config.retry_period)
            try:
                if await self.try_once():
                    last = time.monotonic()
            except (ApiException, OSError, LeaseMissing) as exc:
                log.warning("leader election: cannot renew: %s", exc)
        log.error("leader election: %s lost Lease %s/%s", self.config.identity, self.config.namespace,
                  self.config.name)

    async def release(self) -> None:
        """Hand the Lease back (a graceful stop): a candidate takes it at its next try."""
        try:
            lease = await self.api.get(self.path)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.config.identity:
                return
            spec = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1}
            await self.api.replace(self.path, {**lease, "spec": spec})
        except (ApiException, OSError) as exc:
            log.warning("leader election: cannot hand the Lease back: %s", exc)
