"""shim.requireNodeLabel through the whole pipeline: GPU pods go only to nodes the node agent
labelled gpushare-webhook.io/shim, and the extender still places them there.

The fake nodes stand for GPU nodes with and without the agent's label (the agent itself is
tested against the API server in tests/apiserver/test_node_agent.py).
"""

from __future__ import annotations

from tests.controlplane.scheduling import ANNOTATIONS
from tests.scheduler.helpers import Pipeline, extender_annotations, gpu_pod

REQUIRE = "shim: {requireNodeLabel: true}\n"
SHIM = {"gpushare-webhook.io/shim": "0123456789ab"}


def test_gpu_pods_bind_only_to_labelled_nodes_and_the_extender_places_them(
    pipeline: Pipeline,
) -> None:
    pipeline.policy(REQUIRE)
    pipeline.node("bare", gpus=4, memory=16)  # room for all, but no shim
    labelled = pipeline.node("shim", gpus=1, memory=16, labels=SHIM)
    for index in range(4):
        pipeline.create(gpu_pod(f"train-{index}", "4"))
        pod = pipeline.placed(f"train-{index}")
        assert pod["spec"]["nodeName"] == labelled
        assert set(extender_annotations(pod)) == set(ANNOTATIONS)
        (term,) = pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert term == {
            "matchExpressions": [{"key": "gpushare-webhook.io/shim", "operator": "Exists"}]
        }
    (seen,) = pipeline.plane.inspect(labelled)["nodes"]
    assert seen["usedGPU"] == 16

    # The labelled node is full; the bare one has 64 GiB free, and still gets nothing.
    pipeline.create(gpu_pod("next", "4"))
    message = pipeline.pending("next")
    assert "didn't match Pod's node affinity/selector" in message
