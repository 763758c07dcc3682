"""The Kubernetes operator (``autellix operator``): AutellixEngine and AgentProgram.

Pure parts (spec parsing, manifests, conditions, the autoscaler's decision) are
functions tested directly; ``kubeapi`` and ``gateway_client`` are thin I/O
adapters; ``handlers`` wires them into kopf, a few lines per handler.
"""

GROUP = "autellix.ai"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
ENGINE_KIND = "AutellixEngine"
ENGINE_PLURAL = "autellixengines"
PROGRAM_KIND = "AgentProgram"
PROGRAM_PLURAL = "agentprograms"
#: kopf's finalizer: only on an AgentProgram whose session is open (``handlers``).
FINALIZER = f"{GROUP}/finalizer"
