"""The data dir holds secrets and metadata: only the gateway's own user may read it.

Tokens, the MQTT secret, the registry and the audit log all live there, so the dir is mode 0700
and every file the gateway makes in it 0600, from its creation (no window in which another user
could open it). A looser dir or file, left by an older version or made by hand, is tightened when
the gateway opens it, and the log says so. The dir's mode alone would protect the files; the
files' own modes keep them private when they are copied or the dir is loosened again.

``KeptJson`` is the home of every JSON file the gateway rewrites whole (``boards.json``, the
voice servers' settings): one that cannot be read is never written over (see there).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from gateway.errors import ConfigError, StorageUnavailable

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "KeptJson",
    "create_private",
    "open_private",
    "private_dir",
    "tighten",
    "usable_data_dir",
]

logger = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
_OTHERS = 0o077  # the group's and everyone else's bits


def private_dir(path: Path) -> Path:
    """Make the dir ``path`` (mode 0700), or tighten it if it exists and is looser; return it."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    tighten(path)
    return path


def usable_data_dir(path: Path) -> Path:
    """Make the data dir ``path`` private and prove the gateway can write in it; return it.

    Writes a temporary file rather than asking ``os.access``, which says yes to root on a
    read-only volume.

    Raises:
        ConfigError: ``path`` (or a parent) is a file, or the gateway cannot write there; one
            sentence with the fix, where the gateway would otherwise fail deep in a traceback.
    """
    fix = "set GATEWAY_DATA_DIR (or --data-dir) to a directory this user can write"
    blocker = next((p for p in (path, *path.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        where = "is a file" if blocker == path else f"cannot be made: {blocker} is a file"
        raise ConfigError("data_dir", f"{path} {where}, not a directory; {fix}")
    try:
        private_dir(path)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise ConfigError(
            "data_dir", f"the gateway cannot write in {path} ({why.lower()}); {fix}"
        ) from None
    return path


def create_private(path: Path) -> Path:
    """Create ``path`` empty with mode 0600 unless it exists (then tighten it); return it."""
    private_dir(path.parent)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    tighten(path)
    return path


def open_private(path: Path) -> int:
    """A descriptor appending to ``path``, which is created with mode 0600 (or tightened)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
    if os.fstat(fd).st_mode & _OTHERS:  # an older file: the mode above only applies to new ones
        tighten(path)
    return fd


def tighten(path: Path) -> None:
    """Take the group's and others' permissions off ``path`` if it has any; log it."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return
    if not mode & _OTHERS:
        return
    if mode & stat.S_ISVTX:  # /tmp and the like: shared on purpose, never ours to close
        logger.warning("%s is a shared directory: other users may read what the gateway keeps "
                       "there; give the gateway a data dir of its own", path)  # fmt: skip
        return
    try:
        os.chmod(path, mode & ~_OTHERS)
    except OSError as exc:  # not its owner: say so, and go on (the gateway still works)
        logger.warning("%s is mode %04o and cannot be made private (%s): other users may read "
                       "it; chown it to this user", path, mode, exc.strerror or exc)  # fmt: skip
        return
    # An empty dir (a fresh container volume, a dir made for the gateway) held nothing to
    # expose: making it private is the first start's work, not news.
    log = logger.info if path.is_dir() and not any(path.iterdir()) else logger.warning
    log("%s was mode %04o; made it %04o (only this user)", path, mode, mode & ~_OTHERS)


class KeptJson:
    """A JSON document in the data dir, rewritten whole: 0600, written beside it then renamed
    over it (a crash mid-write leaves the old file whole).

    A file that cannot be read (not JSON, not UTF-8, not the ``kind`` of document expected, no
    permission) is never written over: what it holds is not in memory to be written back. It
    stays where it is, untouched; the log says so when it is loaded, and every ``save`` is
    refused with ``StorageUnavailable`` naming it, until the owner repairs it and restarts the
    gateway, or moves it away (then the next save writes a new file).
    """

    def __init__(self, path: Path, kind: type[list[Any]] | type[dict[str, Any]], holds: str):
        """``holds`` says what the file keeps, for the owner: "the boards added at run time"."""
        self.path = path
        self.unreadable: str | None = None  # why the file could not be read when loaded
        self._kind = kind
        self._holds = holds

    def load(self) -> Any:
        """The document (a ``kind``); an empty one when there is no file or it is unreadable."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return self._kind()
        except (OSError, ValueError) as exc:  # ValueError: bad JSON, or bytes that are not UTF-8
            return self._refuse((isinstance(exc, OSError) and exc.strerror) or str(exc))
        if not isinstance(data, self._kind):
            return self._refuse(f"a JSON {type(data).__name__}, not a {self._kind.__name__}")
        return data

    def save(self, data: list[Any] | dict[str, Any]) -> None:
        """Write ``data`` in place of the file.

        Raises:
            StorageUnavailable: the file was unreadable when loaded and is still there: nothing
                was written.
            OSError: the file cannot be written (a full or read-only data dir).
        """
        if self.unreadable is not None:
            if self.path.exists() or self.path.is_symlink():
                raise StorageUnavailable(
                    f"{self.path} cannot be read ({self.unreadable}); nothing was saved, since "
                    f"writing it would lose {self._holds} it holds: repair it and restart the "
                    "gateway, or move it away"
                )
            self.unreadable = None  # moved away by the owner: nothing is left to lose
        temporary = create_private(self.path.with_name(self.path.name + ".new"))
        temporary.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(temporary, self.path)

    def _refuse(self, why: str) -> Any:
        self.unreadable = why
        logger.error("%s is unreadable (%s): it is kept as it is and nothing is written over it; "
                     "%s it holds are not used until it is repaired (then restart the gateway) "
                     "or moved away", self.path, why, self._holds)  # fmt: skip
        return self._kind()
