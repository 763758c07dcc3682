"""The clairvoyant order: every program ranked by its whole work, known before it starts; a ceiling, not a system.

No scheduler can know a program's size before it runs; the simulator can, by running the same programs
twice. Pass one runs them as ``autellix-no-admission`` and records each program's total model time and
generated tokens (a subagent counts in its root program). Pass two runs the same programs again, each call
carrying as its ``service`` its program's rank, into the engine plugin's preemptive multi-level queue with
levels fine enough that the rank's order is the queue's order (``CLAIRVOYANT_LEVELS``), no anti-starvation
and no committed service. The rank is Smith's rule for the mean program token latency: the mean of
response time / tokens is a mean response time weighted by 1/tokens, which the order of size / weight,
remaining model time x generated tokens, minimises on one machine. The engine keeps the largest service a
program's calls carried, so each program keeps the rank of its first call: its whole size.

``autellix sim sweep --figures check`` holds autellix's mean to this order's at the overloaded points
(``docs/simulation.md``, "The clairvoyant ceiling").
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from autellix.core import SchedulerConfig

#: Levels 1.25x apart from 1 ms to 10^7 s: fine enough that the rank's order is the queue's order; no
#: anti-starvation.
CLAIRVOYANT_LEVELS = SchedulerConfig(boundaries=tuple(1e-3 * 1.25**i for i in range(103)), beta=math.inf)
#: The system pass one runs as: what the programs' work is measured under.
LEARNING_SYSTEM = "autellix-no-admission"


def root(program_id: str) -> str:
    """A subagent's program (``root/name``) counts in its root's work."""
    return program_id.split("/", 1)[0]


@dataclass
class Clairvoyance:
    """What pass one learns of each program's work, and what pass two has served of it
    (``autellix.sim.serving.ProgramRanks``)."""

    learning: bool = True
    #: The engine keeps the first call's rank: the program's whole size (``ProgramRanks.latest``).
    latest: bool = False
    model_time: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    tokens: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    served: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def finished(self, program_id: str, model_time: float, output_tokens: int) -> None:
        """One call of ``program_id`` finished: learnt in pass one, served in pass two."""
        key = root(program_id)
        if self.learning:
            self.model_time[key] += model_time
            self.tokens[key] += output_tokens
        else:
            self.served[key] += model_time

    def ended(self, program_id: str) -> None:
        """Nothing to do: what a program did is kept for the pass after."""

    def rank(self, program_id: str) -> float:
        """The service a call of ``program_id`` carries in pass two (lower runs first): its program's
        remaining model time times its generated tokens."""
        key = root(program_id)
        remaining = max(self.model_time[key] - self.served[key], 1e-3)
        return remaining * self.tokens[key]
