"""ATLAS, width-aware: programs ranked by all the engine time they took, calls
of one program in the order of its critical path.

The paper's ATLAS charges a program only its critical path: a finished call
sets ``service = max(service, inherited + model_time)``, so parallel siblings
do not add up. That lets width buy priority: a program that runs 8 calls at
once is charged as if it ran one, keeps its place in the top queues while it
takes 8 times the engine, and single-threaded programs wait behind it (on a
multi-agent mix the real engine measured the paper's rule 2.4-3x worse than a
client-side PLAS, and the simulator shows the same: ``docs/scheduling.md``).

Here a program's priority against other programs is its total attained service
(the sum of its calls' model time, what PLAS charges): the engine time all its
parallel calls took, and, while a round of them is in flight, what the round has
committed it to (``ProcessTable.view``, PLAS alike). ATLAS's two points survive:

* **Calls of one program go in critical-path order.** The process table keeps
  the critical path as well (``ProgramEntry.critical_path``, updated by the
  paper's rule) and each call inherits it at arrival; the path only grows, so
  a program's waiting calls, which share one queue (the one its priority
  selects), run FCFS, i.e. in order of the critical path they extend.
* **A wide program is not starved.** Its waiting calls all share the
  program's one priority (no straggler is left behind its siblings), and
  anti-starvation compares the program's summed wait with its summed service,
  the same units, so a wide program is promoted as soon as a narrow one with
  the same wait-to-service ratio would be.
"""

from __future__ import annotations

from autellix.core.policies.plas import PLAS


class ATLAS(PLAS):
    """PLAS's rule between programs (total engine time: width is charged) and its queues; the
    critical path that orders a program's own calls is the process table's."""

    name = "atlas"
