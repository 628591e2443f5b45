"""The node agent's install, on real files: a shared library gcc makes here, under a temp host root.

No mock: the libraries are compiled on the spot; the other architecture's
is the same library with its ELF e_machine rewritten (no cross compiler
is needed to make the header the installer reads), and the garbage and
truncated ones are cut from it. The label is tested against the real API
server in tests/apiserver/test_node_agent.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from webhook.cli import main
from webhook.decision.policy import DEFAULT_POLICY, parse_policy_text
from webhook.errors import ShimError
from webhook.node.agent import Counts, Target, install_shim, one_round, run
from webhook.node.install import check_elf, digest, install_library, machine_of

X86_64 = (62, "x86-64")


def _compile(tmp: Path, name: str, body: str) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    source = tmp / f"{name}.c"
    source.write_text(body)
    out = tmp / f"{name}.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(out), str(source)], check=True, timeout=60)
    return out


@pytest.fixture
def library(tmp_path: Path) -> Path:
    return _compile(tmp_path, "shim-v1", "int gpushare_shim_version(void) { return 1; }\n")


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    (root / "usr/local/vgpu").mkdir(parents=True)
    return root


def _target(library: Path, host: Path, policy_text: str = "") -> Target:
    policy = parse_policy_text(policy_text) if policy_text else DEFAULT_POLICY
    return Target.of(policy, source=library, host_root=host)


def test_a_library_is_installed_then_left_alone(library: Path, host: Path) -> None:
    target = _target(library, host)
    first = install_shim(target)
    assert first.outcome == "installed"
    assert first.path == host / "usr/local/vgpu/libvgpu.so"
    assert first.sha256 == digest(library)
    assert digest(first.path) == first.sha256
    inode = first.path.stat().st_ino
    again = install_shim(target)
    assert again.outcome == "current"
    assert again.path.stat().st_ino == inode  # not rewritten
    assert sorted(p.name for p in first.path.parent.iterdir()) == ["libvgpu.so"]  # no temp left


def test_an_upgrade_is_a_new_inode_and_the_mapped_one_is_unchanged(
    library: Path, host: Path, tmp_path: Path
) -> None:
    install_shim(_target(library, host))
    installed = host / "usr/local/vgpu/libvgpu.so"
    with installed.open("rb") as held:  # a running process's view of the old library
        old = os.fstat(held.fileno())
        newer = _compile(tmp_path, "shim-v2", "int gpushare_shim_version(void) { return 2; }\n")
        done = install_shim(_target(newer, host))
        assert done.outcome == "installed"
        assert installed.stat().st_ino != old.st_ino
        held.seek(0)
        assert held.read() == library.read_bytes()  # the old inode kept its bytes
    assert digest(installed) == digest(newer)


def test_ld_so_preload_is_installed_with_the_policy_switch(library: Path, host: Path) -> None:
    install_shim(_target(library, host, "shim: {ldSoPreload: true}"))
    preload = host / "usr/local/vgpu/ld.so.preload"
    assert preload.read_text() == "/usr/local/vgpu/libvgpu.so\n"
    install_shim(_target(library, host))  # off: left as it is, never removed under a pod
    assert preload.exists()


def _bad_files(library: Path, tmp: Path) -> dict[str, tuple[Path, str]]:
    data = library.read_bytes()
    other = bytearray(data)
    other[18:20] = (183).to_bytes(2, "little")  # AArch64
    executable = bytearray(data)
    executable[16:18] = (2).to_bytes(2, "little")  # ET_EXEC
    thirty_two = bytearray(data)
    thirty_two[4] = 1
    files = {
        "garbage": (b"#!/bin/sh\necho not a library\n", "is not an ELF shared library"),
        "truncated": (data[:10], "is not an ELF shared library"),
        "empty": (b"", "is not an ELF shared library"),
        "other-arch": (bytes(other), "is built for ELF machine 183, but this node is x86-64 (62)"),
        "executable": (bytes(executable), "is an ELF file of type 2, not a shared library"),
        "32-bit": (bytes(thirty_two), "is a 32-bit ELF file"),
    }
    found = {}
    for name, (content, message) in files.items():
        path = tmp / f"{name}.so"
        path.write_bytes(content)
        found[name] = (path, message)
    found["missing"] = (tmp / "nowhere.so", "does not exist")
    found["directory"] = (tmp, "is a directory, not a library")
    return found


BAD = [
    "garbage",
    "truncated",
    "empty",
    "other-arch",
    "executable",
    "32-bit",
    "missing",
    "directory",
]


@pytest.mark.parametrize("kind", BAD)
def test_a_bad_source_is_refused_and_the_installed_library_kept(
    kind: str, library: Path, host: Path, tmp_path: Path
) -> None:
    good = install_library(library, host / "usr/local/vgpu", "libvgpu.so", machine=X86_64)
    path, message = _bad_files(library, tmp_path)[kind]
    with pytest.raises(ShimError, match=re.escape(message)):
        install_library(path, host / "usr/local/vgpu", "libvgpu.so", machine=X86_64)
    assert digest(good.path) == good.sha256
    assert sorted(p.name for p in good.path.parent.iterdir()) == ["libvgpu.so"]


@pytest.mark.parametrize("kind", BAD)
def test_the_cli_says_a_bad_source_in_one_line(
    kind: str, library: Path, host: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if machine_of() != X86_64 and kind == "other-arch":
        pytest.skip("the other architecture is AArch64, this machine's")
    path, message = _bad_files(library, tmp_path)[kind]
    code = main(["node", "install-shim", "--source", str(path), "--host-root", str(host)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert message in err
    assert "Traceback" not in err


def test_the_cli_installs_and_says_what_it_did(
    library: Path, host: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["node", "install-shim", "--source", str(library), "--host-root", str(host)]
    assert main(args) == 0
    assert capsys.readouterr().out == (
        f"{host}/usr/local/vgpu/libvgpu.so: installed (sha256 {digest(library)})\n"
    )
    assert main(args) == 0
    assert "current" in capsys.readouterr().out


def test_a_missing_host_directory_is_one_line(
    library: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["node", "install-shim", "--source", str(library), "--host-root", str(tmp_path)])
    assert code == 2
    assert "is not a directory: mount the node's shim directory there" in capsys.readouterr().err


def test_the_agent_needs_a_node_name_to_label(
    library: Path, host: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["node", "agent", "--source", str(library), "--host-root", str(host)]) == 2
    assert "no node name: set NODE_NAME" in capsys.readouterr().err


def test_elf_headers_of_each_machine() -> None:
    header = bytearray(b"\x7fELF\x02\x01\x01" + bytes(9) + (3).to_bytes(2, "little"))
    header += (183).to_bytes(2, "little")
    check_elf(bytes(header), "x", (183, "AArch64"))
    big = b"\x7fELF\x02\x02\x01" + bytes(9) + (3).to_bytes(2, "big") + (21).to_bytes(2, "big")
    check_elf(big, "x", (21, "PowerPC64"))
    with pytest.raises(ShimError, match="is not one the shim is built for"):
        machine_of("sparc64")


class Recorded:
    """A label as a list of what was set: the agent's side of the Label protocol, in memory.

    The real one patches the API server; tests/apiserver/test_node_agent.py runs it.
    """

    def __init__(self) -> None:
        self.value: str | None = None
        self.sets: list[str | None] = []

    def get(self) -> str | None:
        return self.value

    def set(self, value: str | None) -> None:
        self.value = value
        self.sets.append(value)


def test_a_round_labels_and_a_broken_library_unlabels(
    library: Path, host: Path, tmp_path: Path
) -> None:
    label, counts = Recorded(), Counts()
    done = one_round(_target(library, host), label, counts)
    assert done is not None
    assert label.value == done.short == digest(library)[:12]
    one_round(_target(library, host), label, counts)
    assert label.sets == [done.short]  # unchanged: not patched again
    # A broken source keeps the label while the node's copy is good...
    one_round(_target(tmp_path / "gone.so", host), label, counts)
    assert label.value == done.short
    # ...and removes it once the node's copy is gone or broken too.
    done.path.write_bytes(b"truncated")
    one_round(_target(tmp_path / "gone.so", host), label, counts)
    assert label.value is None
    assert (counts.installed, counts.current, counts.skipped) == (1, 1, 2)


def test_the_loop_stops_on_its_event_and_keeps_the_label(library: Path, host: Path) -> None:
    label, stop, rounds = Recorded(), threading.Event(), []

    def after(counts: Counts) -> None:
        rounds.append(counts.installed + counts.current)
        if len(rounds) == 3:
            stop.set()

    counts = run(_target(library, host), label, interval=0.01, stop=stop, on_round=after)
    assert rounds == [1, 2, 3]
    assert label.value == digest(library)[:12]
    assert counts.installed == 1
