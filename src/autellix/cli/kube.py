"""``autellix operator`` (the Kubernetes operator, ``autellix.kube``) and ``autellix kube`` (its tools)."""

from __future__ import annotations

from typing import Annotated

import typer

from autellix.cli.common import fail

app = typer.Typer(no_args_is_help=True)


@app.callback()
def kube() -> None:
    """Tools for a cluster the operator serves (docs/operator.md)."""


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
    engine_image: Annotated[str | None, typer.Option(
        help="Engine image when a spec names none and asks for no GPU")] = None,
    engine_gpu_image: Annotated[str | None, typer.Option(
        help="Engine image when a spec names none and asks for GPUs (resources.gpus > 0): the CUDA build")] = None,
    inference_pool: Annotated[bool, typer.Option(help="Also an InferencePool per AutellixEngine")] = False,
    epp: Annotated[bool, typer.Option(
        help="Also run `autellix epp` as each AutellixEngine's endpoint picker (implies --inference-pool)")] = False,
    epp_image: Annotated[str | None, typer.Option(help="The picker's image (the gateway image)")] = None,
    epp_replicas: Annotated[int, typer.Option(min=1, help="Picker replicas per engine")] = 2,
    epp_fallbacks: Annotated[int, typer.Option(
        min=0, help="Fallback endpoints the picker names (0 for ORIGINAL_DST gateways)")] = 0,
    epp_failure_mode: Annotated[str, typer.Option(help="The InferencePool's failureMode: FailClose or FailOpen")] = (
        "FailClose"),
    epp_service_account: Annotated[str | None, typer.Option(
        help="The pickers' service account (may list and watch EndpointSlices)")] = None,
    epp_store_url: Annotated[str | None, typer.Option(
        help="The program store the pickers share with the gateways (redis://...)")] = None,
    epp_store_password_secret: Annotated[str | None, typer.Option(
        help="A Secret in each served namespace whose data key 'password' is the store's password")] = None,
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
    xds_host: Annotated[str, typer.Option(
        help="xDS: the address the ADS server listens on (in a pod: its IP, which the xDS Service reaches)")] = (
        "127.0.0.1"),
    verbose: Annotated[bool, typer.Option(help="Debug logging")] = False,
) -> None:
    """The Kubernetes operator: AutellixEngine -> engine Deployment + Service (autoscaled),
    AgentProgram -> Job + gateway session (docs/operator.md)."""
    import asyncio

    import kopf

    from autellix.kube.context import OperatorConfig
    from autellix.kube.run import run_operator

    if not gateway_url.startswith(("http://", "https://")):
        raise fail(f"--gateway-url: expected an http(s) URL, got {gateway_url!r}")
    kopf.configure(verbose=verbose)
    if gateway_admin_url is not None and not gateway_admin_url.startswith(("http://", "https://")):
        raise fail(f"--gateway-admin-url: expected an http(s) URL, got {gateway_admin_url!r}")
    if epp and not epp_image:
        raise fail("--epp needs --epp-image (the image that runs `autellix epp`)")
    if epp_failure_mode not in ("FailClose", "FailOpen"):
        raise fail(f"--epp-failure-mode: FailClose or FailOpen, not {epp_failure_mode!r}")
    if epp_store_password_secret is not None and not epp_store_url:
        raise fail("--epp-store-password-secret needs --epp-store-url (the store the password is for)")
    from autellix.kube.manifests import PickerSettings, with_password

    if epp_store_password_secret is not None and epp_store_url:  # the password goes into its host part
        try:
            with_password(epp_store_url, "x")
        except ValueError:
            raise fail(f"--epp-store-url: expected redis://HOST:PORT/DB, got {epp_store_url!r}") from None
    picker = PickerSettings(image=epp_image, replicas=epp_replicas, fallbacks=epp_fallbacks,
                            failure_mode=epp_failure_mode, service_account=epp_service_account,
                            store_url=epp_store_url, store_password_secret=epp_store_password_secret) \
        if epp and epp_image else None
    config = OperatorConfig(gateway_url=gateway_url.rstrip("/"), gateway_api_key=gateway_api_key,
                            gateway_admin_url=gateway_admin_url.rstrip("/") if gateway_admin_url else None,
                            gateway_admin_key=gateway_admin_key, engine_token_secret=engine_token_secret,
                            autoscale_interval=autoscale_interval, program_poll_interval=program_poll_interval,
                            inference_pool=inference_pool or epp, endpoint_picker=picker,
                            **({"engine_image": engine_image} if engine_image else {}),
                            **({"engine_gpu_image": engine_gpu_image} if engine_gpu_image else {}))
    import signal
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
    if xds_port is not None and not xds_namespace:
        raise fail("--xds-port needs --xds-namespace (or $POD_NAMESPACE): where the gateway Service is")

    async def serve() -> None:
        # SIGTERM (the kubelet's) and SIGINT stop it gracefully in either role: a standby replica waiting for
        # the Lease too, which kopf's own handlers (the leader's) do not cover. In a container the operator is
        # PID 1, which the kernel spares every signal it has no handler for: without these a standby would sit
        # out the pod's whole grace period, and a namespace's deletion with it.
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        operator_run = run_operator(config, namespaces=list(namespace or []), liveness_endpoint=liveness,
                                    leader=lease, stop_flag=stop)
        if xds_port is not None:  # every replica serves xDS, the leader or not (it reads, never writes)
            from autellix.mesh.kube_source import serve_xds_with
            from autellix.mesh.resources import MeshSettings

            envoy_listens = MeshSettings(listen_host=xds_listen_host, listen_port=xds_listen_port)
            operator_run = serve_xds_with(operator_run, envoy_listens, xds_gateway_service, str(xds_namespace),
                                          host=xds_host, port=xds_port)
        await operator_run

    try:
        asyncio.run(serve())
    except ConfigException as exc:
        raise fail(f"no Kubernetes credentials (in-cluster service account or kubeconfig): {exc}") from None
    except LeadershipLost as exc:
        raise fail(f"{exc}; exiting so the pod restarts as a candidate") from None


@app.command("release-finalizers")
def release_finalizers(
    namespace: Annotated[str | None, typer.Option(
        "--namespace", "-n", help="Namespace of the resources (default: the kubeconfig context's)")] = None,
    all_namespaces: Annotated[bool, typer.Option("--all-namespaces", "-A", help="Every namespace")] = False,
    all_resources: Annotated[bool, typer.Option(
        "--all", help="Also from resources not being deleted (before removing the operator for good)")] = False,
) -> None:
    """Drop the finalizer older operators set (autellix.ai/finalizer) from AutellixEngines and AgentPrograms
    being deleted: the way out when no operator runs and `kubectl delete` (of them, their namespace or the
    CRDs) waits."""
    import asyncio

    from kubernetes_asyncio.client.exceptions import ApiException
    from kubernetes_asyncio.config import ConfigException, list_kube_config_contexts

    from autellix.kube.finalizers import Released
    from autellix.kube.finalizers import release_finalizers as release
    from autellix.kube.kubeapi import KubeApi

    if namespace is not None and all_namespaces:
        raise fail("--namespace and --all-namespaces: give one")

    async def run() -> list[Released]:
        api = await KubeApi.from_environment()
        try:
            scope = None if all_namespaces else namespace or current_namespace()
            return await release(api, scope, deleting_only=not all_resources)
        finally:
            await api.close()

    def current_namespace() -> str:
        """The kubeconfig context's namespace, as kubectl takes it (in a pod, with no kubeconfig: default)."""
        try:
            _, context = list_kube_config_contexts()
        except ConfigException:
            return "default"
        return (context or {}).get("context", {}).get("namespace") or "default"

    try:
        released = asyncio.run(run())
    except ConfigException as exc:
        raise fail(f"no Kubernetes credentials (in-cluster service account or kubeconfig): {exc}") from None
    except ApiException as exc:
        raise fail(f"the API server refused: {exc.status} {exc.reason}") from None
    for item in released:
        typer.echo(f"{item.kind.lower()}.autellix.ai/{item.name} -n {item.namespace}: finalizer released")
    if not released:
        typer.echo("nothing held by the operator's finalizer")
