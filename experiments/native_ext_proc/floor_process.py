"""The native ext_proc floor (``floor.cc``) as a picker process that ``autellix_lab.epp_local.LocalGie`` starts."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from autellix.child_processes import free_ports, owned_child
from autellix.epp.contract import endpoint_of


class NativeFloor:
    """``floor ADDRESS ENDPOINT``: every call Envoy asks about goes to the first engine."""

    def __init__(self, binary: Path, engines: Sequence[str]) -> None:
        self.binary, self.engines = binary, list(engines)
        [self.port] = free_ports(1)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> None:
        self.process = subprocess.Popen([str(self.binary), self.address, endpoint_of(self.engines[0])],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        stdin=subprocess.DEVNULL, **owned_child())
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.binary} did not listen on {self.address}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
