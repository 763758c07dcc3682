"""The Kubernetes operator (``autellix operator``): AutellixEngine and AgentProgram.

Pure parts (spec parsing, manifests, status, conditions, Events, the autoscaler's
decision) are functions tested directly; ``kubeapi``, ``gateway_client`` and
``recorder`` are thin I/O adapters; ``engines`` and ``programs`` do the work on
each kind, ``handlers`` wires it into kopf and ``run`` runs kopf and the
periodic passes.
"""

GROUP = "autellix.ai"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
ENGINE_KIND = "AutellixEngine"
ENGINE_PLURAL = "autellixengines"
PROGRAM_KIND = "AgentProgram"
PROGRAM_PLURAL = "agentprograms"
#: kopf's finalizer under our name. The operator sets it on nothing (``handlers``); older versions put it
#: on AgentPrograms with an open session (and, earlier, on every engine): kopf drops it where it finds it.
FINALIZER = f"{GROUP}/finalizer"
