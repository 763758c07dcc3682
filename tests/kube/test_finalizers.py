"""The way out when no operator runs: ``autellix kube release-finalizers`` drops the operator's finalizer
from the resources being deleted, and only the operator's (tests/cluster runs it on a real API server)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autellix.kube import FINALIZER
from autellix.kube.finalizers import Released, release_finalizers, release_patch
from autellix.kube.kubeapi import KubeApi
from tests.kube.conftest import NAMESPACE, eventually
from tests.kube.kmock_cluster import Cluster
from tests.kube.test_engine_operator import engine
from tests.kube.test_gateway_membership import kubeconfig_for

PROGRAMS = f"/apis/autellix.ai/v1alpha1/namespaces/{NAMESPACE}/agentprograms"
ENGINES = f"/apis/autellix.ai/v1alpha1/namespaces/{NAMESPACE}/autellixengines"
OTHER = "example.com/keep"


def held(name: str, *finalizers: str) -> dict[str, Any]:
    return {"apiVersion": "autellix.ai/v1alpha1", "kind": "AgentProgram",
            "metadata": {"name": name, "namespace": NAMESPACE, "finalizers": list(finalizers)},
            "spec": {"image": "agent:1"}}


def test_the_patch_drops_only_the_operators_finalizer_of_what_is_being_deleted() -> None:
    deleting = {"metadata": {"resourceVersion": "7", "deletionTimestamp": "2026-12-05T00:00:00Z",
                             "finalizers": [OTHER, FINALIZER]}}
    assert release_patch(deleting) == {"metadata": {"resourceVersion": "7", "finalizers": [OTHER]}}
    living = {"metadata": {"resourceVersion": "7", "finalizers": [FINALIZER]}}
    assert release_patch(living) is None
    assert release_patch(living, deleting_only=False) == {"metadata": {"resourceVersion": "7", "finalizers": []}}
    assert release_patch({"metadata": {"deletionTimestamp": "t", "finalizers": [OTHER]}}) is None
    assert release_patch({"metadata": {"deletionTimestamp": "t"}}) is None


@pytest.mark.asyncio
async def test_held_resources_go_and_others_stay(cluster: Cluster, api: KubeApi) -> None:
    """No operator runs: a deleted program waits on the finalizer until it is released; a program being
    deleted for another's finalizer keeps that one; one not being deleted is left alone."""
    for name, finalizers in (("stuck", [FINALIZER]), ("shared", [FINALIZER, OTHER]), ("alive", [FINALIZER])):
        await api.create(PROGRAMS, held(name, *finalizers))
    await api.delete(f"{PROGRAMS}/stuck")
    await api.delete(f"{PROGRAMS}/shared")
    assert (await api.get(f"{PROGRAMS}/stuck"))["metadata"]["deletionTimestamp"]  # held, nobody to release it

    released = await release_finalizers(api, NAMESPACE)
    assert sorted(released, key=lambda r: r.name) == [Released("AgentProgram", NAMESPACE, "shared"),
                                                      Released("AgentProgram", NAMESPACE, "stuck")]
    await eventually(lambda: _gone(api, f"{PROGRAMS}/stuck"), what="the released program gone")
    assert (await api.get(f"{PROGRAMS}/shared"))["metadata"]["finalizers"] == [OTHER]
    assert (await api.get(f"{PROGRAMS}/alive"))["metadata"]["finalizers"] == [FINALIZER]
    assert await release_finalizers(api, NAMESPACE) == []  # nothing left to do


@pytest.mark.asyncio
async def test_the_command_releases_them(cluster: Cluster, api: KubeApi, tmp_path: Path) -> None:
    """``autellix kube release-finalizers -n NS`` as a user runs it, with a kubeconfig: an engine an older
    operator finalized, being deleted, goes."""
    older = engine("older")
    older["metadata"]["finalizers"] = [FINALIZER]
    await api.create(ENGINES, older)
    await api.delete(f"{ENGINES}/older")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig_for(cluster, tmp_path / "kubeconfig")), "HOME": str(tmp_path)}
    done = await asyncio.to_thread(  # the emulator serves from this test's event loop
        subprocess.run, [sys.executable, "-c", "from autellix.cli.kube import app; app(prog_name='autellix kube')",
                         "release-finalizers", "-n", NAMESPACE], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"autellixengine.autellix.ai/older -n {NAMESPACE}: finalizer released"
    await eventually(lambda: _gone(api, f"{ENGINES}/older"), what="the engine gone")


async def _gone(api: KubeApi, path: str) -> bool:
    return await api.get(path) is None
