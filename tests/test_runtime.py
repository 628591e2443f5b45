"""The live policy: a change is applied; a broken one is refused, the last good one kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import swap
from webhook.errors import PolicyError
from webhook.serving.runtime import PolicySource


def test_reload_follows_the_configmap_symlink_swap(tmp_path: Path) -> None:
    swap(tmp_path, "gpuMemory: 16\n", 1)
    source = PolicySource(tmp_path / "policy.yaml", interval=0)
    assert source.get().gpu_memory == 16
    swap(tmp_path, "gpuMemory: 40\n", 2)
    assert source.get().gpu_memory == 40
    assert source.reloads == 1
    assert not source.stale


def test_broken_policy_keeps_the_last_good_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    swap(tmp_path, "gpuMemory: 24\n", 1)
    source = PolicySource(tmp_path / "policy.yaml", interval=0)
    for generation, broken in enumerate(["gpuMemroy: 24\n", "gpuMemory: [\n", ""], start=2):
        if broken == "":
            (tmp_path / "..data").unlink()  # deleted: the file is briefly missing
        else:
            swap(tmp_path, broken, generation)
        assert source.get().gpu_memory == 24
        assert source.stale
    assert "'gpuMemroy' is not known" in caplog.text
    swap(tmp_path, "gpuMemory: 32\n", 9)
    assert source.get().gpu_memory == 32
    assert not source.stale


def test_an_invalid_policy_at_start_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text("memoryUnit: GB\n")
    with pytest.raises(PolicyError, match="'memoryUnit': 'GB' is not allowed"):
        PolicySource(tmp_path / "policy.yaml")


def test_checks_are_throttled(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text("gpuMemory: 16\n")
    source = PolicySource(tmp_path / "policy.yaml", interval=3600)
    (tmp_path / "policy.yaml").write_text("gpuMemory: 80\n")
    assert source.get().gpu_memory == 16  # not looked at again within the interval
    assert source.refresh()
    assert source.get().gpu_memory == 80
