"""Camera photos devices upload: each device's latest, kept on disk, and handed to its calls.

A device uploads a photo while one of its calls runs (stock firmware's ``take_photo`` posts it to
the vision URL given in ``initialize``, then returns the upload's answer as its result). Every
call in flight on that device *catches* what arrives meanwhile (``catching``): the photo, or why
the gateway refused one, so the call's result can carry the picture itself or say what went
wrong. The latest photo of each device is kept in the data dir (``photos/``, private), where
hosts read it as a resource and the dashboard shows it, and so are the few before it (``history``
photos a device, ``[vision] photo_history``): ``<device>.jpg`` is the latest, ``<device>@<id>.jpg``
an older one. Only their metadata stays in memory, so ten thousand devices with a photo each
cost a few megabytes.

A photo that cannot be written (a full disk) is still handed to the calls waiting for it and
kept in memory as the device's latest until the next one, up to a budget for the whole fleet
(past it, only its record is kept): the failure is logged, no call loses its photo.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import tempfile
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from gateway.datadir import private_dir
from gateway.devices.subscribers import AwaitedSubscribers, Unsubscribe

__all__ = ["PHOTO_URI_PREFIX", "Catch", "Catching", "Photo", "PhotoStore", "alias_of", "image_type",
           "photo_ref", "photo_uri"]  # fmt: skip

logger = logging.getLogger(__name__)

_SUFFIXES = {"image/jpeg": ".jpg", "image/png": ".png"}
_QUESTION_CHARS = 500
_MEMORY_BUDGET = 32 * 1024 * 1024  # photos held in memory while the disk refuses them


PHOTO_URI_PREFIX = "device://"
LATEST = "latest"
_HISTORY_MARK = "@"  # never in a file stem: device ids are percent-quoted


def photo_uri(alias: str, photo_id: str = LATEST) -> str:
    """The MCP resource URI of a device's latest photo, or of the one called ``photo_id``."""
    return f"{PHOTO_URI_PREFIX}{alias}/photo/{photo_id}"


def photo_ref(uri: str) -> tuple[str, str] | None:
    """The device alias and photo (``latest`` or a photo's id) a photo URI names, else None."""
    if not uri.startswith(PHOTO_URI_PREFIX):
        return None
    alias, sep, which = uri[len(PHOTO_URI_PREFIX) :].partition("/photo/")
    if not sep or not alias or "/" in alias or not (which == LATEST or which.isdigit()):
        return None
    return alias, which


def alias_of(uri: str) -> str | None:
    """The device alias a photo URI names, or None if it names none."""
    ref = photo_ref(uri)
    return ref[0] if ref is not None else None


def image_type(data: bytes) -> str | None:
    """The MIME type of ``data`` by its magic bytes: JPEG or PNG, else None."""
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    return None


@dataclass(frozen=True, slots=True)
class Photo:
    """One photo a device took: what it is, and where its bytes are."""

    device_id: str
    mime: str
    size: int
    taken_at: float  # epoch seconds
    question: str  # what the photo was taken to answer (stock firmware sends it along)
    path: Path | None  # None when it could not be written: then ``data`` holds it
    data: bytes | None = field(default=None, repr=False)

    @property
    def id(self) -> str:
        """Its name among the device's photos, stable while it is kept: when it was taken (ms)."""
        return str(round(self.taken_at * 1000))

    def read(self) -> bytes:
        """The photo's bytes.

        Raises:
            OSError: the file went away or cannot be read.
        """
        if self.data is not None:
            return self.data
        if self.path is None:
            raise OSError("the photo was not kept: the data dir could not take it")
        return self.path.read_bytes()

    def as_json(self) -> dict[str, object]:
        """What the store keeps beside the photo (and the JSON API shows)."""
        return {
            "device": self.device_id,
            "mime": self.mime,
            "bytes": self.size,
            "taken_at": self.taken_at,
            "question": self.question,
        }


@dataclass(slots=True)
class Catch:
    """What a device uploaded while one call of it ran."""

    photos: list[Photo] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)


class Catching:
    """``with PhotoStore.catching(device_id) as catch``: a class, not a generator (every call
    enters one)."""

    __slots__ = ("_catch", "_catches", "_device_id")

    def __init__(self, catches: dict[str, list[Catch]], device_id: str) -> None:
        self._catches, self._device_id, self._catch = catches, device_id, Catch()

    def __enter__(self) -> Catch:
        self._catches.setdefault(self._device_id, []).append(self._catch)
        return self._catch

    def __exit__(self, *exc: object) -> None:
        catches = self._catches[self._device_id]
        catches.remove(self._catch)
        if not catches:
            del self._catches[self._device_id]


Arrived = Callable[[Photo], Awaitable[None]]


class PhotoStore:
    """Each device's last ``history`` photos under ``directory`` (None: in memory only, the
    latest alone)."""

    def __init__(self, directory: Path | None, history: int = 1) -> None:
        if history < 1:
            raise ValueError("a device keeps at least its latest photo")
        self._directory = directory
        self._history_size = history
        self._latest: dict[str, Photo] = {}
        self._older: dict[str, list[Photo]] = {}  # newest first, each on disk
        self._arrivals: AwaitedSubscribers[[Photo]] = AwaitedSubscribers()
        self._catches: dict[str, list[Catch]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._in_memory = 0  # bytes of the photos kept in memory only
        if directory is not None:
            private_dir(directory)
            self._load(directory)

    def subscribe_arrivals(self, arrived: Arrived) -> Unsubscribe:
        """Await ``arrived`` with each new photo from now on (MCP notifications)."""
        return self._arrivals.subscribe(arrived)

    def latest(self, device_id: str) -> Photo | None:
        """The device's latest photo, if it has taken one."""
        return self._latest.get(device_id)

    def history(self, device_id: str) -> list[Photo]:
        """The device's photos kept, newest (its latest) first."""
        latest = self._latest.get(device_id)
        return [latest, *self._older.get(device_id, ())] if latest is not None else []

    def find(self, device_id: str, photo_id: str) -> Photo | None:
        """The device's kept photo called ``photo_id`` (or ``latest``)."""
        if photo_id == LATEST:
            return self.latest(device_id)
        return next((p for p in self.history(device_id) if p.id == photo_id), None)

    def photos(self) -> list[Photo]:
        """Every device's latest photo, newest first."""
        return sorted(self._latest.values(), key=lambda p: p.taken_at, reverse=True)

    def waiting(self, device_id: str) -> bool:
        """Is a call of ``device_id`` running, so that a photo from it has somewhere to go?"""
        return bool(self._catches.get(device_id))

    def catching(self, device_id: str) -> Catching:
        """Collect what ``device_id`` uploads until the block ends (one call's lifetime)."""
        return Catching(self._catches, device_id)

    def refuse(self, device_id: str, reason: str) -> None:
        """Tell the device's running calls that an upload of it was refused, and why."""
        for catch in self._catches.get(device_id, ()):
            catch.refusals.append(reason)

    async def keep(self, device_id: str, data: bytes, mime: str, question: str) -> Photo:
        """Store ``data`` as the device's latest photo and hand it to its running calls.

        The calls get the bytes just received, not the file, which a later upload may replace.
        """
        photo = Photo(device_id, mime, len(data), time.time(), question[:_QUESTION_CHARS], None)
        for catch in self._catches.get(device_id, ()):
            catch.photos.append(dataclasses.replace(photo, data=data))
        async with self._lock(device_id):  # one device's uploads are written one at a time
            latest = self._latest.get(device_id)
            if latest is not None and photo.taken_at < latest.taken_at + 0.002:
                photo = dataclasses.replace(photo, taken_at=latest.taken_at + 0.002)  # new id
            if self._directory is not None:
                try:
                    kept = list(self._older.get(device_id, ()))
                    older = await asyncio.to_thread(self._retire, device_id, latest, kept)
                    self._older[device_id] = older  # set here, not in the worker thread
                    photo = await asyncio.to_thread(self._write, photo, data)
                except OSError as exc:
                    logger.warning(
                        "photo of %s kept in memory only: cannot write it: %s",
                        device_id,
                        exc.strerror or exc,
                    )
            replaced = self._latest.get(device_id)
            if replaced is not None and replaced.data is not None:
                self._in_memory -= replaced.size
            if photo.path is None and self._in_memory + len(data) <= _MEMORY_BUDGET:
                photo = dataclasses.replace(photo, data=data)
                self._in_memory += len(data)
            self._latest[device_id] = photo
        await self._arrivals.notify(photo)
        return photo

    def _retire(self, device_id: str, latest: Photo | None, older: list[Photo]) -> list[Photo]:
        """The older photos once ``latest`` joins them (its files renamed), those past
        ``history`` dropped (their files deleted)."""
        assert self._directory is not None
        if latest is not None and latest.path is not None and self._history_size > 1:
            paths = _paths(self._directory, device_id, latest.id)
            with contextlib.suppress(OSError):  # lost from the history, never from the latest
                os.replace(latest.path, paths[latest.mime])
                _write_private(paths["meta"], json.dumps(latest.as_json()).encode())
                older.insert(0, dataclasses.replace(latest, path=paths[latest.mime]))
        while len(older) > self._history_size - 1:
            gone = older.pop()
            for path in _paths(self._directory, device_id, gone.id).values():
                with contextlib.suppress(OSError):
                    path.unlink()
        return older

    def _lock(self, device_id: str) -> asyncio.Lock:
        return self._locks.setdefault(device_id, asyncio.Lock())

    def forget(self, device_id: str) -> None:
        """Delete the device's photo (the device was forgotten)."""
        photo = self._latest.pop(device_id, None)
        if photo is not None and photo.data is not None:
            self._in_memory -= photo.size
        older = self._older.pop(device_id, [])
        if self._directory is not None:
            for photo_id in (None, *(p.id for p in older)):
                for path in _paths(self._directory, device_id, photo_id).values():
                    with contextlib.suppress(OSError):
                        path.unlink()

    def _write(self, photo: Photo, data: bytes) -> Photo:
        assert self._directory is not None
        paths = _paths(self._directory, photo.device_id)
        photo = dataclasses.replace(photo, path=paths[photo.mime])
        _write_private(paths[photo.mime], data)
        _write_private(paths["meta"], json.dumps(photo.as_json()).encode())
        for mime, path in paths.items():  # a PNG replacing a JPEG leaves no stale file
            if mime not in (photo.mime, "meta"):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        return photo

    def _load(self, directory: Path) -> None:
        for meta in directory.glob("*.json"):
            try:
                fields = json.loads(meta.read_text(encoding="utf-8"))
                mime = fields["mime"]
                photo = Photo(
                    device_id=str(fields["device"]),
                    mime=mime,
                    size=int(fields["bytes"]),
                    taken_at=float(fields["taken_at"]),
                    question=str(fields.get("question", "")),
                    path=_paths(directory, str(fields["device"]))[mime],
                )
            except (OSError, ValueError, KeyError, TypeError):
                logger.warning("photo record %s cannot be read; skipped", meta.name)
                continue
            if _HISTORY_MARK in meta.stem:
                paths = _paths(directory, photo.device_id, photo.id)
                photo = dataclasses.replace(photo, path=paths[mime])
                if photo.path is not None and photo.path.exists():
                    self._older.setdefault(photo.device_id, []).append(photo)
            elif photo.path is not None and photo.path.exists():
                self._latest[photo.device_id] = photo
        for older in self._older.values():
            older.sort(key=lambda p: p.taken_at, reverse=True)


def _paths(directory: Path, device_id: str, photo_id: str | None = None) -> dict[str, Path]:
    """The device's files by MIME type, and its record (``meta``): of its latest photo, or of
    the older one called ``photo_id``.

    Named by appending to the quoted id, never with ``with_suffix``: an id may hold dots, and
    ``a.b`` must not share ``a``'s files.
    """
    stem = urllib.parse.quote(device_id, safe="")
    if photo_id is not None:
        stem += _HISTORY_MARK + photo_id
    named = {mime: directory / (stem + suffix) for mime, suffix in _SUFFIXES.items()}
    return {**named, "meta": directory / (stem + ".json")}


def _write_private(path: Path, data: bytes) -> None:
    # Write-then-rename: a reader never sees half a photo; 0600 from the start (mkstemp).
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
