"""The endpoint picker's own metrics, in the gateway's registry (``autellix_epp_*`` beside ``autellix_*``)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from autellix.protocol import APIError

#: A decision takes microseconds to milliseconds (a shared store's round trips at most, a tenant's queue aside).
DECISION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class PickerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.decisions = Counter(
            "autellix_epp_decisions", "Requests the picker answered, by outcome: routed (a program's call), "
            "passthrough (another request, to the least-loaded engine), answered (a session route or /ready, by "
            "the picker), shed (429), unavailable (503: no endpoint ready, or no decision in time), refused "
            "(another 4xx)", ["outcome"], registry=r)
        self.decision_seconds = Histogram(
            "autellix_epp_decision_seconds", "From a request's last body byte at the picker to its routing answer",
            buckets=DECISION_BUCKETS, registry=r)
        self.shed = Counter("autellix_epp_shed", "Calls shed with a 429, by reason (the error's code)", ["code"],
                            registry=r)
        self.fallbacks = Histogram("autellix_epp_fallback_endpoints", "Fallback endpoints named per routed call",
                                   buckets=(0, 1, 2, 4, 8), registry=r)
        self.served_by_fallback = Counter(
            "autellix_epp_served_by_fallback", "Calls the gateway served on a fallback endpoint, not the chosen one",
            registry=r)
        self.streams = Gauge("autellix_epp_streams", "ext_proc streams open (requests in flight through the picker)",
                             registry=r)
        self._decisions: dict[str, Any] = {}  # labelled children, looked up once (the hot path)

    def decided(self, outcome: str, seconds: float, *, fallbacks: int | None = None) -> None:
        child = self._decisions.get(outcome) or self._decisions.setdefault(outcome, self.decisions.labels(outcome))
        child.inc()
        self.decision_seconds.observe(seconds)
        if fallbacks is not None:
            self.fallbacks.observe(fallbacks)

    def refused(self, exc: APIError) -> None:
        """A request answered in the picker's place."""
        if exc.status == 429:
            self.decisions.labels("shed").inc()
            self.shed.labels(exc.code or exc.type).inc()
        elif exc.status == 503:
            self.decisions.labels("unavailable").inc()
        else:
            self.decisions.labels("refused").inc()


__all__ = ["DECISION_BUCKETS", "PickerMetrics"]
