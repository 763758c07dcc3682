"""Moved to :mod:`autellix.child_processes` (OS child processes are not the gateway's);
this name stays until its last importers (bench/) switch."""

from autellix.child_processes import autellix_process, free_port, free_ports, gateway_process

__all__ = ["autellix_process", "free_port", "free_ports", "gateway_process"]
