"""The one rule for watched files (policy and certificate pair): bytes decide, last good kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook.serving.reload import WatchedFiles


class Broken(Exception):
    """What a loader raises when the files hold nothing usable."""


def watch(path: Path) -> tuple[WatchedFiles[str], list[str], list[str]]:
    loads: list[str] = []
    errors: list[str] = []

    def load() -> str:
        text = path.read_text() if path.exists() else ""
        loads.append(text)
        if not text.startswith("good"):
            raise Broken(f"{path.name}: {text or 'missing'}")
        return text

    return (
        WatchedFiles([path], load, errors=(Broken,), interval=0, on_error=errors.append),
        loads,
        errors,
    )


def test_an_in_place_rewrite_within_one_clock_tick_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("good 1")
    files, _, _ = watch(path)
    path.write_text("good 2")  # same size, and likely the same mtime
    assert files.get() == "good 2"
    assert files.reloads == 1


@pytest.mark.parametrize(
    "broken",
    ["bad", ""],  # unusable bytes; the file briefly missing
)
def test_a_broken_change_keeps_the_last_good_value_and_is_tried_once(
    tmp_path: Path, broken: str
) -> None:
    path = tmp_path / "f"
    path.write_text("good 1")
    files, loads, errors = watch(path)
    if broken:
        path.write_text(broken)
    else:
        path.unlink()
    for _ in range(3):
        assert files.get() == "good 1"
    assert files.error == errors[0] == f"f: {broken or 'missing'}"
    assert (len(loads), files.failures, files.reloads) == (2, 1, 0)  # the same bytes: no retry
    path.write_text("good 3")
    assert files.get() == "good 3"
    assert (files.error, files.reloads) == ("", 1)


def test_unchanged_files_are_not_loaded_again(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("good")
    files, loads, _ = watch(path)
    path.write_text("good")  # rewritten, same bytes
    assert not files.refresh()
    assert len(loads) == 1


def test_a_broken_file_at_start_is_the_callers_error(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("bad")
    with pytest.raises(Broken, match="f: bad"):
        watch(path)


def test_checks_are_throttled_to_the_interval(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("good 1")
    files = WatchedFiles([path], path.read_text, errors=(OSError,), interval=3600)
    path.write_text("good 2")
    assert files.get() == "good 1"
    assert files.refresh()
    assert files.get() == "good 2"
