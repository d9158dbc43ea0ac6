"""Tests for gateway.datadir: a private dir and private files, made so or tightened and logged;
kept JSON files, never written over when they cannot be read."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from gateway.datadir import KeptJson, create_private, open_private, private_dir, tighten
from gateway.errors import StorageUnavailable


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_data_dir_is_made_0700(tmp_path: Path) -> None:
    """The dir and any missing parent are made; the dir itself is 0700."""
    path = private_dir(tmp_path / "a" / "data")
    assert mode(path) == 0o700


def test_a_looser_data_dir_is_tightened_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 0755 dir that holds files becomes 0700, and the log warns; a private dir is left
    alone, silently."""
    path = tmp_path / "data"
    path.mkdir(mode=0o755)
    os.chmod(path, 0o755)
    (path / "device_token").touch()
    private_dir(path)
    assert mode(path) == 0o700
    assert "was mode 0755; made it 0700" in caplog.text
    caplog.clear()
    private_dir(path)
    assert caplog.text == ""


def test_a_fresh_empty_volume_is_made_private_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A container's new volume (empty, 0755): made 0700 on the first start, with no warning."""
    caplog.set_level(logging.INFO, logger="gateway.datadir")
    path = tmp_path / "data"
    path.mkdir(mode=0o755)
    os.chmod(path, 0o755)
    private_dir(path)
    assert mode(path) == 0o700
    assert [r.levelname for r in caplog.records] == ["INFO"]


def test_files_are_made_0600_or_tightened(tmp_path: Path) -> None:
    """A new file is 0600 from its creation; an existing 0644 one loses the others' bits."""
    made = create_private(tmp_path / "new")
    old = tmp_path / "old"
    old.write_text("kept")
    os.chmod(old, 0o644)
    create_private(old)
    assert (mode(made), mode(old), old.read_text()) == (0o600, 0o600, "kept")


def test_open_private_appends_to_a_0600_file(tmp_path: Path) -> None:
    """``open_private`` creates 0600, appends, and tightens a looser file it opens."""
    path = tmp_path / "log"
    for text in (b"one\n", b"two\n"):
        fd = open_private(path)
        os.write(fd, text)
        os.close(fd)
        os.chmod(path, 0o644)
    fd = open_private(path)
    os.close(fd)
    assert (path.read_bytes(), mode(path)) == (b"one\ntwo\n", 0o600)


def test_a_file_that_cannot_be_tightened_is_logged_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another user's file (chmod refused) leaves a warning that names the fix; nothing raises."""
    path = tmp_path / "theirs"
    path.write_text("")
    os.chmod(path, 0o644)

    def refuse(*args: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "chmod", refuse)  # chmod does not stop root: refuse it here
    tighten(path)
    tighten(tmp_path / "missing")
    assert mode(path) == 0o644
    assert "cannot be made private (Operation not permitted)" in caplog.text


def test_a_shared_sticky_dir_is_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A data dir pointed at /tmp-like shared space is not closed to its other users: a warning."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    private_dir(shared)
    assert mode(shared) == 0o1777
    assert "is a shared directory" in caplog.text


def test_a_kept_json_file_is_written_whole_and_read_back(tmp_path: Path) -> None:
    """save() writes the document (0600) and load() reads it; no file reads as empty."""
    kept = KeptJson(tmp_path / "boards.json", list, "the boards")
    assert kept.load() == [] and kept.unreadable is None
    kept.save([{"url": "http://h/mcp"}])
    assert KeptJson(kept.path, list, "the boards").load() == [{"url": "http://h/mcp"}]
    assert mode(kept.path) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["boards.json"]  # nothing left beside it


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b'[{"url": "http://h/mcp", "token": "t"}, {"url": "http://i', "Unterminated"),
        (b'{"url": "http://h/mcp"}', "a JSON dict, not a list"),
        (b"\xff\xfe[]", "utf-8"),
    ],
)
def test_an_unreadable_kept_file_is_never_written_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes, why: str
) -> None:
    """A file that cannot be read loads as empty, is logged, and every save is refused with
    an error naming it: the file stays byte for byte as it was."""
    path = tmp_path / "boards.json"
    path.write_bytes(content)
    kept = KeptJson(path, list, "the boards added at run time")
    with caplog.at_level(logging.ERROR):
        assert kept.load() == []
    assert str(path) in caplog.text and why in caplog.text
    for _ in range(2):
        with pytest.raises(StorageUnavailable, match="nothing was saved") as refused:
            kept.save([{"url": "http://new/mcp"}])
        assert str(path) in str(refused.value) and "the boards added at run time" in str(
            refused.value
        )
        assert path.read_bytes() == content
    assert [p.name for p in tmp_path.iterdir()] == ["boards.json"]


def test_an_unreadable_file_the_owner_moved_away_is_written_anew(tmp_path: Path) -> None:
    """Once the owner moves the unreadable file away, the next save writes a new one."""
    path = tmp_path / "boards.json"
    path.write_text("[{")
    kept = KeptJson(path, list, "the boards")
    kept.load()
    path.rename(tmp_path / "boards.json.broken")
    kept.save([{"url": "http://new/mcp"}])
    assert KeptJson(path, list, "the boards").load() == [{"url": "http://new/mcp"}]
    assert (tmp_path / "boards.json.broken").read_text() == "[{"


def test_a_kept_file_that_cannot_be_opened_is_not_written_over(tmp_path: Path) -> None:
    """No permission to read it (or a directory in its place): refused alike."""
    path = tmp_path / "boards.json"
    path.mkdir()
    kept = KeptJson(path, list, "the boards")
    assert kept.load() == [] and kept.unreadable
    with pytest.raises(StorageUnavailable):
        kept.save([])
    assert path.is_dir()
