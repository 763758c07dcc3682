"""The program-level benchmark: agent programs built from the shared workload data."""

from autellix.bench.programs import CALIBRATIONS, WORKLOADS, AgentProgram, make_programs

__all__ = ["CALIBRATIONS", "WORKLOADS", "AgentProgram", "make_programs"]
