"""Realistic AdmissionReviews for the benchmark: GPU pods of 1-8 containers, and rejections."""

from __future__ import annotations

import json
import random
from typing import Any


def _managed_fields() -> list[dict[str, Any]]:
    return [
        {
            "manager": "kube-controller-manager",
            "operation": "Update",
            "apiVersion": "v1",
            "time": "2026-12-01T10:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}}},
                "f:spec": {
                    "f:containers": {
                        f'k:{{"name":"c{i}"}}': {".": {}, "f:image": {}} for i in range(4)
                    }
                },
            },
        }
    ]


def gpu_pod(containers: int, *, gpu: str = "1", rng: random.Random) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "initContainers": [
            {
                "name": "fetch",
                "image": "busybox",
                "resources": {"limits": {"aliyun.com/gpu-mem": "1"}},
            }
        ],
        "containers": [],
        "volumes": [{"name": "data", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}],
    }
    for i in range(containers):
        spec["containers"].append(
            {
                "name": f"c{i}",
                "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                "env": [
                    {"name": "MODEL", "value": "llama"},
                    {"name": "LD_PRELOAD", "value": "/opt/libtrace.so"},
                    {"name": "SEED", "value": str(rng.randint(0, 9999))},
                ],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "resources": {
                    "limits": {
                        "aliyun.com/gpu-mem": gpu if i == 0 else "1",
                        "cpu": "2",
                        "memory": "8Gi",
                    },
                    "requests": {"cpu": "1", "memory": "4Gi"},
                },
            }
        )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "train-",
            "namespace": "team-a",
            "labels": {"app": "train"},
            "managedFields": _managed_fields(),
        },
        "spec": spec,
    }


def review(obj: dict[str, Any], uid: str) -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "team-a",
                "operation": "CREATE",
                "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                "object": obj,
                "oldObject": None,
                "dryRun": False,
            },
        }
    ).encode()


def mix(count: int, seed: int = 7) -> list[bytes]:
    """A fixed mix: mostly GPU pods of 1-8 containers, one in five rejected (too large)."""
    rng = random.Random(seed)
    bodies = []
    for n in range(count):
        size = rng.randint(1, 8)
        gpu = "64" if n % 5 == 4 else "2"
        bodies.append(review(gpu_pod(size, gpu=gpu, rng=rng), f"uid-{n}"))
    return bodies
