"""The serving stacks that the benchmark (``autellix bench sweep``) and the
simulator (``autellix sim --system``, ``autellix sim sweep``) compare: one table.

* ``vllm``: bare engine, FCFS, prefix caching off (the paper's baseline);
* ``vllm-opt``: bare engine, FCFS, prefix caching and chunked prefill on;
* ``gateway-fcfs``: ``vllm-opt`` behind the gateway, which ranks nothing (FCFS,
  every program admitted): what the hop alone costs;
* ``client-plas``: bare engine with stock vLLM's ``--scheduling-policy
  priority``, no gateway; each program sends its own generated-token count,
  bucketed, as the calls' ``priority`` (``autellix.workloads.client_priority``):
  what a user can do in ten lines without Autellix;
* ``vllm-priority``: stock vLLM priority scheduling behind the gateway, which
  sends each call's PLAS queue level as ``priority`` (no plugin, no preemption);
* ``mlfq``: gateway and engine plugin with classic MLFQ (every call starts in Q1);
* ``plas``: gateway and engine plugin with PLAS;
* ``autellix``: gateway and engine plugin with the default policy (width-aware
  ATLAS), and program admission (``autellix.core.admission``);
* ``autellix-no-admission``: the same, every program admitted at once;
* ``llmd-fairness``: llm-d's program-aware flow control (gateway-side
  per-program queues while the pool is saturated, ``autellix.core.flow_control``)
  in front of stock vLLM engines run as ``vllm-opt``: the program-aware rival
  (docs/rival.md);
* ``clairvoyant`` (simulator only): no system a user can pick, a ceiling: every
  program ranked by its whole work, known before it starts (``autellix.sim.clairvoyant``);
* ``autellix-declared``: ``autellix`` with every program declaring the tokens it
  will generate in all (``expected_tokens``, ``autellix.control.size_hints``), each
  declaration off by a factor of e^N(0, 0.5) (a client's estimate, within a factor of
  1.65 two times in three): what declaring is worth. The simulator learns each
  program's size by a first run; on a real engine a program declares what its plan
  fixes (``bfcl``, ``tool-pause``), and one without a plan declares nothing.

Standard library only: ``autellix.loadgen`` and ``autellix.sim`` both read it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class System:
    """A serving stack: the engine's scheduler and features, and the gateway's policy."""

    name: str
    #: The engine's scheduler: ``autellix`` (the plugin, running ``policy``), ``vllm-priority``
    #: (stock vLLM, ``--scheduling-policy priority``) or ``fcfs``; the real engine's
    #: (``autellix.engine.launch.SCHEDULERS``) and the engine model's
    #: (``autellix.sim.engine_model.SCHEDULERS``).
    engine_scheduler: str
    #: The gateway's policy (its process table and the engine plugin's); None: no gateway, bare engines.
    policy: str | None
    prefix_caching: bool = True
    #: The engine model's chunked prefill (the simulator's ``vllm`` baseline has none);
    #: the benchmark's real engines keep vLLM's default.
    chunked_prefill: bool = True
    #: No gateway: each program sends its own bucketed token count as vLLM's
    #: ``priority`` (``autellix.workloads.client_priority``).
    client_priority: bool = False
    #: llm-d's flow control in front of the engines: calls wait at the gateway in
    #: per-program queues while the pool is saturated (``autellix.core.flow_control``).
    flow_control: bool = False
    #: Program admission: new programs wait while the engines are full (``autellix.core.admission``).
    admission: bool = False
    #: Each program ranked by its whole work, learnt by a first run of the same programs (the simulator's
    #: ceiling, ``autellix.sim.clairvoyant``; no real engine can run it).
    clairvoyant: bool = False
    #: Every program declares the tokens it will generate in all, off by a log-normal factor of this sigma
    #: (``autellix.control.size_hints``, ``autellix.workloads.base.declarations``): in the simulator what a
    #: first run of the same programs learnt; on a real engine what the program's plan fixes
    #: (``AgentProgram.expected_tokens``; a program without one declares nothing). None: no program declares.
    declared_error: float | None = None

    @property
    def two_pass(self) -> bool:
        """The simulator runs the programs once to learn what they do."""
        return self.clairvoyant or self.declared_error is not None


#: The paper's systems (Figure 12), the other policies of the core, and ``client-plas``.
SYSTEMS: dict[str, System] = {
    "vllm": System("vllm", "fcfs", None, prefix_caching=False, chunked_prefill=False),
    "vllm-opt": System("vllm-opt", "fcfs", None),
    "gateway-fcfs": System("gateway-fcfs", "fcfs", "fcfs"),
    "client-plas": System("client-plas", "vllm-priority", None, client_priority=True),
    "vllm-priority": System("vllm-priority", "vllm-priority", "plas"),
    "mlfq": System("mlfq", "autellix", "mlfq"),
    "plas": System("plas", "autellix", "plas"),
    "autellix": System("autellix", "autellix", "atlas", admission=True),
    "autellix-no-admission": System("autellix-no-admission", "autellix", "atlas"),
    "llmd-fairness": System("llmd-fairness", "fcfs", None, flow_control=True),
    "clairvoyant": System("clairvoyant", "autellix", "atlas", clairvoyant=True),
    "autellix-declared": System("autellix-declared", "autellix", "atlas", admission=True, declared_error=0.5),
}

#: The systems real engines run (``autellix bench``): all but the simulator's ceiling. There ``autellix-declared``'s
#: programs declare what their plans fix (``AgentProgram.expected_tokens``), and those without a plan nothing.
REAL_SYSTEMS: dict[str, System] = {name: system for name, system in SYSTEMS.items() if not system.clairvoyant}

__all__ = ["REAL_SYSTEMS", "SYSTEMS", "System"]
