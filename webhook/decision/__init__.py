"""The decision: what to answer for one AdmissionReview, as pure functions of their arguments.

Owns everything a rule depends on: quantities, the policy model, the GPU
bounds of a pod's placement, reading a pod's asks and its model (what its
scheduler holds), the confinement checks (every refusal), the injection
(scheduler, volume, mounts, env) and the patch, the guard made from a
policy, and the AdmissionReview envelope in and out.

This module is its face: the other packages import what is listed in
``__all__`` from ``webhook.decision`` and nothing from the modules behind
it (an import-linter contract in pyproject.toml holds it). A name of the
face never shadows a module behind it: ``plan.plan`` is ``decide`` here and
``guard.guard`` is ``make_guard``. The node list's
snapshot format is here too: the node watch (``webhook.cluster``) writes it
and the workers (``webhook.serving``) read it, and neither may import the
other.

May import: the standard library, ``webhook.errors``. Never Flask,
gunicorn, cryptography, kubernetes or prometheus_client, and nothing of
``webhook.serving``, ``webhook.cluster`` or the CLI: it reads no file, clock
or socket, so the webhook, the offline preview and the benchmarks all run
exactly this code (import-linter checks it; see pyproject.toml).
"""

from webhook.decision.admission import Result, admit
from webhook.decision.affinity import SHIM_LABEL
from webhook.decision.asks import ContainerAsk
from webhook.decision.capacity import DeviceFacts, GpuNode, NodeFacts, gpu_node
from webhook.decision.claims import DRA_LABEL, MANAGED_BY, is_claimed, template_shape
from webhook.decision.claims import PREFIX as CLAIM_PREFIX
from webhook.decision.claims import template as claim_template
from webhook.decision.contract import ACCOUNTING_VOLUME, REGION_DIR, REGION_SUFFIX
from webhook.decision.fields import STATUS_ANNOTATION, container_label
from webhook.decision.guard import MESSAGE_PREFIX
from webhook.decision.guard import guard as make_guard
from webhook.decision.jsontext import encoder
from webhook.decision.layout import INIT_STEP
from webhook.decision.model import GpuPod, stored_gpu_pod
from webhook.decision.nodesource import (
    NO_DRA,
    DraFacts,
    NodeSource,
    NodeStatus,
    NoNodes,
    class_of,
    decode_snapshot,
    devices_of,
    encode_snapshot,
    facts_of,
    mapping_classes,
    prepare,
)
from webhook.decision.plan import Decision, is_gpu_pod, plan_ephemeral
from webhook.decision.plan import plan as decide
from webhook.decision.policy import DEFAULT_POLICY, Policy, dump_policy, parse_policy_text
from webhook.decision.prepared import Kept, Prepared
from webhook.decision.quantities import BYTES_PER_MIB, go_value, limit_mib

__all__ = [
    "ACCOUNTING_VOLUME",
    "BYTES_PER_MIB",
    "CLAIM_PREFIX",
    "DEFAULT_POLICY",
    "DRA_LABEL",
    "INIT_STEP",
    "MANAGED_BY",
    "MESSAGE_PREFIX",
    "NO_DRA",
    "REGION_DIR",
    "REGION_SUFFIX",
    "SHIM_LABEL",
    "STATUS_ANNOTATION",
    "ContainerAsk",
    "Decision",
    "DeviceFacts",
    "DraFacts",
    "GpuNode",
    "GpuPod",
    "Kept",
    "NoNodes",
    "NodeFacts",
    "NodeSource",
    "NodeStatus",
    "Policy",
    "Prepared",
    "Result",
    "admit",
    "claim_template",
    "class_of",
    "container_label",
    "decide",
    "decode_snapshot",
    "devices_of",
    "dump_policy",
    "encode_snapshot",
    "encoder",
    "facts_of",
    "go_value",
    "gpu_node",
    "is_claimed",
    "is_gpu_pod",
    "limit_mib",
    "make_guard",
    "mapping_classes",
    "parse_policy_text",
    "plan_ephemeral",
    "prepare",
    "stored_gpu_pod",
    "template_shape",
]
