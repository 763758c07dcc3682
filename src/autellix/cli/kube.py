"""``autellix operator``: the Kubernetes operator (``autellix.kube``)."""

from __future__ import annotations

from typing import Annotated

import typer

from autellix.cli.common import fail


def operator(
    gateway_url: Annotated[str, typer.Option(envvar="AUTELLIX_GATEWAY_URL",
                                             help="The gateway's base URL (sessions, engine drain)")] = (
        "http://autellix-gateway"),
    gateway_api_key: Annotated[str | None, typer.Option(envvar="AUTELLIX_GATEWAY_API_KEY",
                                                        help="API key for the gateway, if it needs one")] = None,
    gateway_admin_url: Annotated[str | None, typer.Option(
        envvar="AUTELLIX_GATEWAY_ADMIN_URL",
        help="The gateway's admin listener: drains and AgentProgram sessions on a tenant's behalf")] = None,
    gateway_admin_key: Annotated[str | None, typer.Option(envvar="AUTELLIX_GATEWAY_ADMIN_KEY",
                                                          help="Admin key for the admin listener")] = None,
    engine_token_secret: Annotated[str | None, typer.Option(
        help="Secret (data key 'token') engines take calls with: only the gateway, which shares it")] = None,
    namespace: Annotated[list[str] | None, typer.Option(
        "--namespace", help="Namespace to serve (repeatable; default: the whole cluster)")] = None,
    autoscale_interval: Annotated[float, typer.Option(min=0.1, help="Seconds between autoscaler decisions")] = 15.0,
    program_poll_interval: Annotated[float, typer.Option(min=0.1, help="Seconds between session reads")] = 5.0,
    liveness: Annotated[str | None, typer.Option(
        help="Serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz")] = None,
    leader_lease: Annotated[str | None, typer.Option(
        help="NAMESPACE/NAME of a Lease: reconcile only while holding it (several replicas)")] = None,
    identity: Annotated[str | None, typer.Option(envvar="POD_NAME",
                                                 help="This replica's name in the Lease (default the host)")] = None,
    engine_image: Annotated[str | None, typer.Option(help="Engine image when a spec names none")] = None,
    inference_pool: Annotated[bool, typer.Option(help="Also an InferencePool per AutellixEngine")] = False,
    xds_port: Annotated[int | None, typer.Option(
        min=0, max=65535, help="Serve Envoy's xDS (ADS) on this port, from the gateway Service's EndpointSlices "
                                "(docs/cluster.md); none without")] = None,
    xds_gateway_service: Annotated[str, typer.Option(
        help="xDS: the gateway Service whose ready pods are Envoy's replicas")] = "autellix-gateway",
    xds_namespace: Annotated[str | None, typer.Option(
        envvar="POD_NAMESPACE", help="xDS: the gateway Service's namespace (default: the operator's own)")] = None,
    xds_listen_port: Annotated[int, typer.Option(
        min=1, max=65535, help="xDS: the port Envoy serves the OpenAI API on")] = 8000,
    xds_listen_host: Annotated[str, typer.Option(help="xDS: the address Envoy serves it on")] = "0.0.0.0",
    verbose: Annotated[bool, typer.Option(help="Debug logging")] = False,
) -> None:
    """The Kubernetes operator: AutellixEngine -> engine Deployment + Service (autoscaled),
    AgentProgram -> Job + gateway session (docs/operator.md)."""
    import asyncio

    import kopf

    from autellix.kube.handlers import OperatorConfig
    from autellix.kube.run import run_operator

    if not gateway_url.startswith(("http://", "https://")):
        raise fail(f"--gateway-url: expected an http(s) URL, got {gateway_url!r}")
    kopf.configure(verbose=verbose)
    if gateway_admin_url is not None and not gateway_admin_url.startswith(("http://", "https://")):
        raise fail(f"--gateway-admin-url: expected an http(s) URL, got {gateway_admin_url!r}")
    config = OperatorConfig(gateway_url=gateway_url.rstrip("/"), gateway_api_key=gateway_api_key,
                            gateway_admin_url=gateway_admin_url.rstrip("/") if gateway_admin_url else None,
                            gateway_admin_key=gateway_admin_key, engine_token_secret=engine_token_secret,
                            autoscale_interval=autoscale_interval, program_poll_interval=program_poll_interval,
                            inference_pool=inference_pool, **({"engine_image": engine_image} if engine_image else {}))
    import socket

    from kubernetes_asyncio.config import ConfigException

    from autellix.kube.leader import LeaseConfig
    from autellix.kube.run import LeadershipLost

    lease = None
    if leader_lease:
        lease_namespace, _, lease_name = leader_lease.partition("/")
        if not lease_namespace or not lease_name:
            raise fail(f"--leader-lease: expected NAMESPACE/NAME, got {leader_lease!r}")
        lease = LeaseConfig(lease_namespace, lease_name, identity or socket.gethostname())
    operator_run = run_operator(config, namespaces=list(namespace or []), liveness_endpoint=liveness, leader=lease)
    if xds_port is not None:  # every replica serves xDS, the leader or not (it reads, never writes)
        from autellix.mesh.kube_source import serve_xds_with
        from autellix.mesh.resources import MeshSettings

        if not xds_namespace:
            raise fail("--xds-port needs --xds-namespace (or $POD_NAMESPACE): where the gateway Service is")
        envoy_listens = MeshSettings(listen_host=xds_listen_host, listen_port=xds_listen_port)
        operator_run = serve_xds_with(operator_run, envoy_listens, xds_gateway_service, xds_namespace, port=xds_port)
    try:
        asyncio.run(operator_run)
    except ConfigException as exc:
        raise fail(f"no Kubernetes credentials (in-cluster service account or kubeconfig): {exc}") from None
    except LeadershipLost as exc:
        raise fail(f"{exc}; exiting so the pod restarts as a candidate") from None
