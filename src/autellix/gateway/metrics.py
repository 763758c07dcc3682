"""Prometheus metrics of the gateway, in a registry of its own (one per app), and the controller's events as them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from autellix import protocol
from autellix.control.admission import ProgramGate
from autellix.control.recent import RecentIds
from autellix.core import PrefixIndex, TenantShares
from autellix.stats import jain_index

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
#: Program keys remembered for the per-replica program counter: at most this many, each until it
#: has not been seen for ``key_ttl`` seconds (the program idle TTL: by then its program has
#: expired, and a call with the key again starts a new one).
PROGRAM_KEYS_REMEMBERED = 100_000
CALL_PATHS = frozenset(protocol.CALL_PATHS)  # every call API (Chat, Completions, Responses, Messages)


class _Live(Collector):
    """Values read at scrape time: live programs, per-engine in-flight, fairness."""

    def __init__(self, programs: Callable[[], list[tuple[float, float]]], inflight: Callable[[], dict[str, int]],
                 breakers: Callable[[], dict[str, tuple[str, int]]] | None = None):
        self._programs, self._inflight, self._breakers = programs, inflight, breakers

    def collect(self):
        ratios = self._programs()
        yield GaugeMetricFamily("autellix_live_programs", "Programs in the process table", value=len(ratios))
        fairness = [wait / service for wait, service in ratios if service > 0]
        yield GaugeMetricFamily(
            "autellix_fairness_jain_index",
            "Jain's index of active programs' wait/service ratios (1 = perfectly even)",
            value=jain_index(fairness) if fairness else 1.0,
        )
        g = GaugeMetricFamily("autellix_engine_inflight", "Calls in flight per engine", labels=["engine"])
        for engine, n in self._inflight().items():
            g.add_metric([engine], n)
        yield g
        if self._breakers is not None:
            state = GaugeMetricFamily("autellix_engine_breaker_open",
                                      "1 while an engine's circuit breaker keeps calls away (open or half-open)",
                                      labels=["engine"])
            opened = CounterMetricFamily("autellix_engine_breaker_opened", "Times an engine's breaker opened",
                                         labels=["engine"])
            for engine, (name, times) in self._breakers().items():
                state.add_metric([engine], 0 if name == "closed" else 1)
                opened.add_metric([engine], times)
            yield state
            yield opened


class GatewayMetrics:
    def __init__(self, programs: Callable[[], list[tuple[float, float]]],
                 inflight: Callable[[], dict[str, int]],
                 breakers: Callable[[], dict[str, tuple[str, int]]] | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("autellix_requests", "Requests by route and status", ["route", "status"], registry=r)
        self.errors = Counter("autellix_errors", "Error responses by route and code", ["route", "code"], registry=r)
        self.added_latency = Histogram("autellix_gateway_added_latency_seconds",
                                       "Gateway time before a call is sent upstream", buckets=LATENCY_BUCKETS,
                                       registry=r)
        self.retries = Counter("autellix_upstream_retries", "Calls moved to another engine", registry=r)
        self.attempts = Counter("autellix_upstream_attempts", "Attempts of calls at engines, by outcome "
                                "(ok, http_<status>, connect, disconnected, hung, stream_closed, body_cut, ...)",
                                ["reason"], registry=r)
        self.model_time_source = Counter("autellix_model_time_source",
                                         "Finished calls by where their model time came from", ["source"], registry=r)
        self.call_wait = Histogram("autellix_call_waiting_seconds", "Per-call time not executing (queued)",
                                   buckets=WAIT_BUCKETS, registry=r)
        self.token_latency = Histogram("autellix_program_token_latency_seconds",
                                       "Program response time / generated tokens, at session end",
                                       buckets=WAIT_BUCKETS, registry=r)
        r.register(_Live(programs, inflight, breakers))
        self._requests: dict[tuple[str, int], Any] = {}  # labelled children, looked up once (the hot path)

    def request_counted(self, route: str, status: int) -> None:
        """One more request on ``route`` answered with ``status`` (``requests``, by its cached child)."""
        child = self._requests.get((route, status))
        if child is None:
            child = self._requests[(route, status)] = self.requests.labels(route, str(status))
        child.inc()


class MetricsObserver:
    """The request controller's events (``autellix.control.ControllerObserver``) as this registry's metrics."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.m = metrics
        self._attempts: dict[str, Any] = {}  # labelled children, looked up once (the hot path)
        self._sources: dict[str, Any] = {}

    def routed(self, added_latency: float) -> None:
        self.m.added_latency.observe(added_latency)

    def attempt(self, reason: str, retried: bool) -> None:
        child = self._attempts.get(reason) or self._attempts.setdefault(reason, self.m.attempts.labels(reason))
        child.inc()
        if retried:
            self.m.retries.inc()

    def settled(self, source: str, wait: float) -> None:
        child = self._sources.get(source) or self._sources.setdefault(source, self.m.model_time_source.labels(source))
        child.inc()
        self.m.call_wait.observe(wait)


class AdmissionCollector(Collector):
    """Program admission, read at scrape time: programs admitted and waiting, those held and refused."""

    def __init__(self, gate: ProgramGate) -> None:
        self.gate = gate

    def collect(self):
        yield GaugeMetricFamily("autellix_programs_admitted", "Programs admitted (running or between calls)",
                                value=self.gate.admission.admitted)
        yield GaugeMetricFamily("autellix_programs_waiting", "New programs waiting for admission",
                                value=self.gate.admission.waiting)
        yield CounterMetricFamily("autellix_programs_held", "New programs that waited for admission",
                                  value=self.gate.held)
        yield CounterMetricFamily("autellix_programs_refused", "New programs refused (429): the queue full, "
                                  "or a sheddable class with no room", value=self.gate.refused)


class TenantCollector(Collector):
    """Tenants' shares of model time (``autellix.core.TenantShares``), read at scrape time: a share of the
    engines is ``rate(autellix_tenant_service_seconds_total)`` over the sum of all tenants'."""

    def __init__(self, shares: TenantShares) -> None:
        self.shares = shares

    def collect(self):
        service = CounterMetricFamily("autellix_tenant_service_seconds", "Model time of the tenant's finished "
                                      "calls served through this replica", labels=["tenant"])
        weight = GaugeMetricFamily("autellix_tenant_weight", "The tenant's weight (its keys' weight=W)",
                                   labels=["tenant"])
        lead = GaugeMetricFamily("autellix_tenant_lead_seconds", "How far the tenant is ahead of the least-served "
                                 "active tenant, in model seconds per unit of weight (times the lead's gain)",
                                 labels=["tenant"])
        for share in self.shares:
            label = [share.name or "-"]
            service.add_metric(label, share.service)
            weight.add_metric(label, share.weight)
            lead.add_metric(label, self.shares.lead(share.name or None))
        yield from (service, weight, lead)


class KvIndexCollector(Collector):
    """The KV event index (``core.PrefixIndex``), read at scrape time: the blocks each followed engine holds."""

    def __init__(self, index: PrefixIndex, label: Callable[[str], str]) -> None:
        self.index, self.label = index, label

    def collect(self):
        blocks = GaugeMetricFamily("autellix_kv_index_blocks", "KV blocks the engine holds, as its KV cache events "
                                   "told this replica (engines whose events it follows)", labels=["engine"])
        for engine, held in self.index.summary().items():
            blocks.add_metric([self.label(engine)], held)
        yield blocks


class ReplicaCounters:
    """``autellix_replica_calls_total`` and ``autellix_replica_programs_total``, labelled with the replica's name
    (the pod name in a cluster): with Envoy hashing on the program key, the programs counted over all replicas
    add up to the programs run, each on one replica."""

    def __init__(self, replica: str, registry: CollectorRegistry, *, key_ttl: float = 600.0) -> None:
        calls = Counter("autellix_replica_calls", "Calls (every call API) served by this replica", ["replica"],
                        registry=registry)
        programs = Counter("autellix_replica_programs", "Programs (distinct program keys, plus one per keyless "
                           "call) whose calls this replica served", ["replica"], registry=registry)
        # the labelled children, looked up once (the hot path)
        self._calls, self._programs = calls.labels(replica), programs.labels(replica)
        self._keys = RecentIds(PROGRAM_KEYS_REMEMBERED, key_ttl)

    def count(self, request: web.Request) -> None:
        """A request reached this replica: counted if it is a call."""
        if request.method != "POST" or request.path not in CALL_PATHS:
            return
        self._calls.inc()
        # a keyless call is a program of its own; a key counts once while it is remembered
        key = protocol.program_key(request.headers)
        if key is None or self._keys.add(key, time.monotonic()):
            self._programs.inc()
