"""The photo store: what a device uploads reaches its running calls, and its latest is kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import pytest

from gateway.devices.photos import PhotoStore, alias_of, image_type, photo_ref, photo_uri

pytestmark = pytest.mark.anyio

JPEG = b"\xff\xd8\xff\xe0" + b"x" * 100 + b"\xff\xd9"
PNG = b"\x89PNG\r\n\x1a\n" + b"y" * 100


def test_images_are_known_by_their_magic_bytes() -> None:
    """JPEG and PNG pass; anything else (HTML, a GIF, nothing) does not."""
    assert (image_type(JPEG), image_type(PNG)) == ("image/jpeg", "image/png")
    assert image_type(b"<html>") is image_type(b"GIF89a") is image_type(b"") is None


def test_photo_uris_name_a_device() -> None:
    """device://<name>/photo/latest, and nothing else, names a device's photo."""
    assert alias_of(photo_uri("kitchen")) == "kitchen"
    assert alias_of("device://a/b/photo/latest") is None
    assert alias_of("file:///etc/passwd") is None and alias_of("device:///photo/latest") is None
    assert photo_ref(photo_uri("kitchen", "1764000000000")) == ("kitchen", "1764000000000")
    assert photo_ref("device://kitchen/photo/../x") is None


async def test_only_calls_running_while_a_photo_arrives_get_it(tmp_path: Path) -> None:
    """Each running call of the device catches the photo; another device's calls do not."""
    store = PhotoStore(tmp_path / "photos")
    assert not store.waiting("dev1")
    with store.catching("dev1") as first, store.catching("dev1") as second:
        with store.catching("dev2") as other:
            assert store.waiting("dev1")
            await store.keep("dev1", JPEG, "image/jpeg", "what is it?")
            store.refuse("dev1", "too big")
    assert [p.read() for p in first.photos] == [JPEG] == [p.read() for p in second.photos]
    assert first.refusals == ["too big"] and other.photos == [] and other.refusals == []
    assert not store.waiting("dev1") and not store.waiting("dev2")


async def test_the_latest_photo_is_kept_privately_and_found_again(tmp_path: Path) -> None:
    """A restarted store finds each device's latest photo; a PNG replaces a JPEG cleanly."""
    store = PhotoStore(tmp_path / "photos")
    await store.keep("aa:bb", JPEG, "image/jpeg", "q1")
    await store.keep("aa:bb", PNG, "image/png", "q2")
    assert sorted(p.name for p in (tmp_path / "photos").iterdir()) == [
        "aa%3Abb.json",
        "aa%3Abb.png",
    ]
    assert all(p.stat().st_mode & 0o077 == 0 for p in (tmp_path / "photos").iterdir())
    (tmp_path / "photos" / "broken.json").write_text("{not json")
    again = PhotoStore(tmp_path / "photos").latest("aa:bb")
    assert again is not None and (again.read(), again.mime, again.question) == (
        PNG,
        "image/png",
        "q2",
    )
    again_store = PhotoStore(tmp_path / "photos")
    again_store.forget("aa:bb")
    assert again_store.latest("aa:bb") is None
    assert [p.name for p in (tmp_path / "photos").iterdir()] == ["broken.json"]


async def test_a_photo_that_cannot_be_written_is_still_handed_on(tmp_path: Path) -> None:
    """A disk that fails (here: the directory replaced by a file) loses no photo."""
    directory = tmp_path / "photos"
    store = PhotoStore(directory)
    shutil.rmtree(directory)
    directory.write_text("in the way")
    with store.catching("dev1") as catch:
        photo = await store.keep("dev1", JPEG, "image/jpeg", "")
    assert photo.path is None and catch.photos[0].read() == JPEG
    latest = store.latest("dev1")
    assert latest is not None and latest.read() == JPEG


async def test_an_id_with_a_dot_never_touches_another_device_s_photo(tmp_path: Path) -> None:
    """`aa:bb.jpg` is not `aa:bb`'s: a device named like another plus a dot cannot overwrite,
    spoof or delete the other's photo (ids may hold dots)."""
    store = PhotoStore(tmp_path / "photos")
    await store.keep("aa:bb", JPEG, "image/jpeg", "mine")
    with store.catching("aa:bb") as victim:
        await store.keep("aa:bb.x", PNG, "image/png", "theirs")
        store.forget("aa:bb.x")
    assert victim.photos == []
    latest = PhotoStore(tmp_path / "photos").latest("aa:bb")
    assert latest is not None and latest.read() == JPEG and latest.question == "mine"


async def test_concurrent_uploads_of_one_device_leave_one_whole_photo(tmp_path: Path) -> None:
    """Uploads racing each other are written one at a time; the store keeps a whole photo."""
    store = PhotoStore(tmp_path / "photos")
    photos = [JPEG + bytes([n]) * 50 for n in range(8)]
    async with anyio.create_task_group() as tg:
        for data in photos:
            tg.start_soon(store.keep, "dev1", data, "image/jpeg", "")
    latest = PhotoStore(tmp_path / "photos").latest("dev1")
    assert latest is not None and latest.read() in photos
    assert sorted(p.name for p in (tmp_path / "photos").iterdir()) == ["dev1.jpg", "dev1.json"]


async def test_photos_held_in_memory_for_a_full_disk_have_a_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the budget a device's photo keeps only its record; its call still gets the photo."""
    monkeypatch.setattr("gateway.devices.photos._MEMORY_BUDGET", 2 * len(JPEG))
    directory = tmp_path / "photos"
    store = PhotoStore(directory)
    shutil.rmtree(directory)
    directory.write_text("in the way")
    for device in ("dev1", "dev2"):
        await store.keep(device, JPEG, "image/jpeg", "")
    with store.catching("dev3") as catch:
        await store.keep("dev3", JPEG, "image/jpeg", "")
    assert catch.photos[0].read() == JPEG  # the call lost nothing
    latest = store.latest("dev3")
    assert latest is not None and latest.size == len(JPEG)
    with pytest.raises(OSError, match="not kept"):
        latest.read()
    store.forget("dev1")  # frees its share: the next photo fits again
    await store.keep("dev3", JPEG, "image/jpeg", "")
    assert store.latest("dev3").read() == JPEG  # type: ignore[union-attr]


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


async def test_history_keeps_the_last_photos_and_forget_removes_them_all(tmp_path: Path) -> None:
    """history = 2: the latest and the one before (a PNG after JPEGs too); each has its own id,
    found again after a restart; ``forget`` leaves no file behind."""
    store = PhotoStore(tmp_path, history=2)
    arrived: list[str] = []

    async def note(photo: object) -> None:
        arrived.append(photo.id)

    store.subscribe_arrivals(note)
    for data, mime in ((JPEG, "image/jpeg"), (JPEG + b"2", "image/jpeg"), (PNG, "image/png")):
        await store.keep("aa", data, mime, "")
    kept = store.history("aa")
    assert [p.mime for p in kept] == ["image/png", "image/jpeg"] and kept[0].id == arrived[-1]
    assert len(set(arrived)) == 3 and kept[1].read() == JPEG + b"2"
    assert names(tmp_path) == sorted(
        ["aa.png", "aa.json", f"aa@{kept[1].id}.jpg", f"aa@{kept[1].id}.json"]
    )
    again = PhotoStore(tmp_path, history=2)
    assert [p.id for p in again.history("aa")] == [p.id for p in kept]
    assert again.find("aa", kept[1].id) is not None and again.find("aa", arrived[0]) is None
    again.forget("aa")
    assert names(tmp_path) == [] and again.history("aa") == []


async def test_history_of_one_is_the_latest_alone(tmp_path: Path) -> None:
    store = PhotoStore(tmp_path)
    await store.keep("aa", JPEG, "image/jpeg", "")
    await store.keep("aa", JPEG + b"2", "image/jpeg", "")
    assert len(store.history("aa")) == 1 and names(tmp_path) == ["aa.jpg", "aa.json"]
    with pytest.raises(ValueError, match="at least its latest"):
        PhotoStore(tmp_path, history=0)


async def test_photos_arriving_together_keep_distinct_ids(tmp_path: Path) -> None:
    """Three uploads at once (often within one millisecond): three photos, three files."""
    store = PhotoStore(tmp_path, history=3)
    async with anyio.create_task_group() as group:
        for n in range(3):
            group.start_soon(store.keep, "aa", JPEG + bytes([n]), "image/jpeg", "")
    kept = store.history("aa")
    assert len({p.id for p in kept}) == 3
    assert sorted(p.read() for p in kept) == [JPEG + bytes([n]) for n in range(3)]
