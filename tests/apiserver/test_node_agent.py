"""The node agent against the real API server: its Node labelled, unlabelled, and nothing more.

The agent runs as ``gpushare-webhook node agent`` with a token bound to a
pod on its node (``kubectl create token --bound-object-kind Pod``), as a
DaemonSet pod's projected token is: the API server puts the pod's node in
the token's ``authentication.kubernetes.io/node-name`` claim, and the
shipped ValidatingAdmissionPolicy holds the token to that Node's one label.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import config

from tests.controlplane.install import NS, Installed
from tests.helpers import eventually
from webhook.cluster.nodelabel import NodeLabel
from webhook.errors import KubeError
from webhook.node.install import digest

AGENT = "gpushare-webhook-node-agent"
LABEL = "gpushare-webhook.io/shim"
HERE, THERE = "agent-node-a", "agent-node-b"


def _label(installed: Installed, node: str) -> str | None:
    found = json.loads(installed.plane.kubectl("get", "node", node, "-o", "json").stdout)
    value: str | None = (found["metadata"].get("labels") or {}).get(LABEL)
    return value


@pytest.fixture
def library(tmp_path: Path) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    (tmp_path / "shim.c").write_text("int gpushare_shim(void) { return 1; }\n")
    out = tmp_path / "libshim.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(out), str(tmp_path / "shim.c")], check=True)
    return out


@pytest.fixture
def agent_kubeconfig(installed: Installed, tmp_path: Path) -> Iterator[Path]:
    """A token of the agent's ServiceAccount, bound to a pod on node HERE."""
    plane = installed.plane
    for node in (HERE, THERE):
        plane.kubectl(
            "apply",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}),
        )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "node-agent-probe", "namespace": NS},
        "spec": {
            "serviceAccountName": AGENT,
            "nodeName": HERE,
            "automountServiceAccountToken": False,
            "containers": [{"name": "agent", "image": "gpushare-webhook"}],
        },
    }
    plane.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    token = plane.kubectl(
        "create",
        "token",
        AGENT,
        "-n",
        NS,
        "--bound-object-kind=Pod",
        "--bound-object-name=node-agent-probe",
    ).stdout.strip()
    yield plane.token_kubeconfig(tmp_path / "agent.kubeconfig", token, namespace=NS)
    plane.kubectl("delete", "pod", "node-agent-probe", "-n", NS, "--wait=false", check=False)
    plane.kubectl("delete", "node", HERE, THERE, "--wait=false", check=False)


def _until(check: Callable[[], bool]) -> bool:
    try:
        eventually(check)
    except AssertionError:
        return False
    return True


def _agent(source: Path, host: Path, kubeconfig: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "webhook",
            "node",
            "agent",
            f"--source={source}",
            f"--host-root={host}",
            f"--node-name={HERE}",
            f"--kubeconfig={kubeconfig}",
            "--interval=0.2",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_agent_labels_its_node_keeps_it_on_sigterm_and_unlabels_a_broken_shim(
    installed: Installed, agent_kubeconfig: Path, library: Path, tmp_path: Path
) -> None:
    host = tmp_path / "host"
    (host / "usr/local/vgpu").mkdir(parents=True)
    agent = _agent(library, host, agent_kubeconfig)
    labelled = _until(lambda: _label(installed, HERE) == digest(library)[:12])
    agent.send_signal(signal.SIGTERM)
    _, err = agent.communicate(timeout=30)
    assert labelled, err
    assert (host / "usr/local/vgpu/libvgpu.so").read_bytes() == library.read_bytes()
    assert agent.returncode == 0, err
    assert "Traceback" not in err
    assert _label(installed, HERE) == digest(library)[:12]  # a rolling update keeps it

    broken = tmp_path / "broken.so"
    broken.write_text("not a library\n")
    (host / "usr/local/vgpu/libvgpu.so").unlink()  # the node lost it (re-imaged disk)
    agent = _agent(broken, host, agent_kubeconfig)
    unlabelled = _until(lambda: _label(installed, HERE) is None)
    agent.send_signal(signal.SIGTERM)
    _, err = agent.communicate(timeout=30)
    assert unlabelled, err
    assert "is not an ELF shared library" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["label", "node", THERE, f"{LABEL}=0123456789ab"], "only the Node its own pod runs on"),
        (["label", "node", HERE, "gpushare=true"], "only the label gpushare-webhook.io/shim"),
        (["label", "node", HERE, f"{LABEL}=not-a-sha"], "must be 12 hex digits"),
        (["taint", "node", HERE, "x=y:NoSchedule"], "only the label gpushare-webhook.io/shim"),
    ],
    ids=["other-node", "other-label", "bad-value", "taint"],
)
def test_the_agents_token_may_change_nothing_else(
    installed: Installed, agent_kubeconfig: Path, args: list[str], message: str
) -> None:
    done = installed.plane.kubectl(*args, kubeconfig=agent_kubeconfig, check=False)
    assert done.returncode != 0
    assert message in done.stderr
    allowed = installed.plane.kubectl(
        "label", "node", HERE, f"{LABEL}=0123456789ab", "--overwrite", kubeconfig=agent_kubeconfig
    )
    assert allowed.returncode == 0


def test_a_patch_the_policy_refuses_says_so_in_one_line(
    installed: Installed, agent_kubeconfig: Path
) -> None:
    api = config.new_client_from_config(config_file=str(agent_kubeconfig))
    with pytest.raises(KubeError) as caught:
        NodeLabel(api, THERE, LABEL).set("0123456789ab")
    message = str(caught.value)
    assert message.startswith("an admission policy refused to patch node agent-node-b: ")
    assert "the node agent may change only the Node its own pod runs on" in message
    assert "\n" not in message
