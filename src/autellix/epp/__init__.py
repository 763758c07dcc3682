"""Autellix as the endpoint picker (EPP) of a Gateway API Inference Extension gateway.

A GIE gateway (Envoy Gateway, kgateway, Istio, GKE, agentgateway, or plain
Envoy) asks its endpoint picker, over Envoy's ``ext_proc`` gRPC stream, where
each request to an ``InferencePool`` goes. ``autellix epp`` answers with the
same request controller, program store and policies as the aiohttp gateway:
the gateway is the transport, Autellix still ranks programs and places calls.

* ``contract``: GIE's endpoint picker protocol, its names and value formats;
* ``messages``: Envoy's ext_proc messages read and built (``xds-protos``' types);
* ``exchange``: one request's ext_proc stream, its messages and answers in order;
* ``picker``: the decision for one request and the call's accounting on its answer;
* ``own_routes``: the gateway's session routes and ``/ready``, answered by the picker;
* ``metrics``: ``autellix_epp_*``;
* ``config``, ``compose``: the picker's configuration and composition root (the gateway's parts);
* ``serve``: the process (gRPC ext_proc and health, HTTP metrics, the stop on SIGTERM).

Envoy configured as a GIE gateway, and both on this machine for tests and experiments, are
``autellix_lab.gie_envoy`` and ``autellix_lab.epp_local`` (not shipped).

Needs the ``epp`` extra (``grpcio``, ``grpcio-health-checking``, ``xds-protos``); ``docs/epp.md``.
"""
