"""A request in the engine model: the call as it arrives, its state inside, and what a step and its end report.

:class:`SimRequest` is what a caller (the simulator's gateway, the emulator's
HTTP API) hands the engine; :class:`Seq` is the engine's record of it while it
waits or runs (tokens computed, KV blocks, timing); :class:`StepResult` is one
step's outcome and :class:`RequestOutcome` a request's when it leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class SimRequest:
    """One call as an engine receives it."""

    request_id: str
    #: Prompt token ids; equal prefixes share KV blocks when prefix caching is on.
    prompt: Sequence[int]
    max_tokens: int
    program_id: str | None = None
    thread_id: str | None = None
    #: vLLM-style priority, lower first (the ``vllm-priority`` scheduler's order).
    priority: int = 0
    #: The gateway's ``vllm_xargs``: the program's attained service and waiting time, and the
    #: subagent tree they are the totals of.
    service: float | None = None
    wait: float | None = None
    tree: str | None = None
    #: The model time the program declared it will take (``XARG_DECLARED``).
    declared: float | None = None
    #: The program's tenant and its weight (``XARG_TENANT``).
    tenant: str | None = None
    tenant_weight: float | None = None
    #: A rank set from outside the policy (``autellix.sim.serving.ProgramRanks`` whose ``latest`` is
    #: True): the program's place in the queues is its latest call's, which may fall.
    rank: float | None = None
    #: The tokens it will generate, when the caller knows them (the simulator's
    #: replies): their blocks become shareable with later calls that repeat them.
    output: Sequence[int] | None = None


@dataclass(frozen=True)
class RequestOutcome:
    """A request that left the engine: what vLLM's per-request metrics report."""

    request_id: str
    arrival: float
    finished_at: float
    first_scheduled: float | None
    first_token: float | None
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    #: Execution time: the steps it ran in (the scheduler's own count under the
    #: Autellix scheduler, the sum of its steps' times otherwise).
    model_time: float
    preemptions: int
    aborted: bool = False

    @property
    def queue_time(self) -> float:
        return (self.first_scheduled if self.first_scheduled is not None else self.finished_at) - self.arrival


@dataclass
class StepResult:
    seconds: float
    tokens: dict[str, int]
    first_token: list[str]
    finished: list[str]
    preempted: list[str]
    prefill_tokens: int
    decode_seqs: int
    cached_tokens: int
    #: KV tokens the step's attention read (the cost model's third term).
    kv_tokens: int = 0
    #: Requests admitted from waiting into the batch this step.
    new_requests: int = 0
    #: Requests that finished this step, by id.
    outcomes: dict[str, RequestOutcome] = field(default_factory=dict)
    #: Steps this result stands for (``step`` runs one; ``run_until`` may coalesce several).
    steps: int = 1


class Seq:
    """A request inside the engine."""

    __slots__ = (
        "arrival",
        "blocks",
        "cached",
        "computed",
        "first_scheduled",
        "first_token",
        "hashes",
        "known",
        "model_time",
        "num_output",
        "num_prompt",
        "num_tokens",
        "order",
        "preemptions",
        "priority",
        "program",
        "registered",
        "req",
        "running",
        "tokens",
    )

    def __init__(self, req: SimRequest, arrival: float, order: int) -> None:
        self.req = req
        self.tokens: Sequence[int] = req.prompt if req.output is None else [*req.prompt, *req.output]
        self.num_prompt = len(req.prompt)
        #: Tokens whose ids are known (prompt, plus generated ones the caller gave).
        self.known = self.num_prompt
        self.num_output = 0
        self.num_tokens = self.num_prompt
        self.computed = 0
        self.blocks: list[int] = []
        self.hashes: list[int] = []
        self.registered = 0
        self.arrival = arrival
        self.order = order
        self.priority = req.priority
        #: The program the engine charges it to (the planner's and the retention ledger's key).
        self.program = req.program_id or f"request:{req.request_id}"
        self.running = False
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.model_time = 0.0
        self.preemptions = 0
        self.cached = 0

    def key(self) -> tuple[int, float, int]:
        return (self.priority, self.arrival, self.order)
