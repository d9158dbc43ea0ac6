"""Gathering a device's ``tools/list`` pages into one catalogue.

``ToolCatalog`` holds one listing in progress: it collects every page's tool entries as the
device sent them, follows ``nextCursor`` and refuses cursor loops and runaway page counts. Judging
the entries (names, texts, schemas) is the device layer's business (``gateway.devices.catalogue``):
it must decide tool by tool, and it shares the verdict between devices with the same firmware.
When to request a page and what state that puts the session in is ``DeviceProtocol``'s business.

Devices of the same firmware list the same entries, and the device layer shares one judged
catalogue between them, found by a digest of the entries. Hashing the pages' raw text as they
arrive (``digest``) costs a fraction of serialising every parsed entry again to hash it; the
digest is made of each page's own digest, so that a page kept in the book below is hashed once,
not once per device that lists it (18 KB of SHA-256 a join: about 18 µs, some 3 % of it).

In a storm of joins every device of a firmware sends the same pages. A reply framed as stock
firmware frames it (``envelope.result_text``) carries its page as the raw text of its result:
``stock_page`` finds that text in a ``PageBook`` the device layer shares between sessions, and a
page found there is not parsed at all (nor is the frame); the listing keeps the book's one copy of
the text, not a copy per device, and parses it again only if the device layer does not know the
catalogue yet (``Entries``). A page the book does not hold is parsed alone once, then added.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.protocol import envelope
from gateway.protocol.events import MessageDropped
from gateway.protocol.jsonrpc import ErrorResponse, Response

__all__ = ["Entries", "KnownPage", "PageBook", "ToolCatalog", "read_page"]

JsonObject = dict[str, Any]


class _Stop(Exception):
    """The listing must end before the device's last page; the text says why."""


Page = list[object] | str  # a page's tool entries, or the raw text of a KnownPage


@dataclass(frozen=True, slots=True)
class KnownPage:
    """A well-formed ``tools/list`` result, by the raw text it came in.

    ``text`` parses alone into an object with a ``tools`` array: a stock frame around it
    (``envelope.result_text``) then parses into exactly that result, whatever its session id and
    request id. ``next_cursor`` is its ``nextCursor`` as parsed (None when absent).
    """

    text: str
    next_cursor: object
    digest: bytes = field(init=False, repr=False, compare=False)  # what the listing hashes of it
    size: int = field(init=False, repr=False, compare=False)  # the text's length in UTF-8 bytes

    def __post_init__(self) -> None:
        # Used by every device that lists the page: made once, kept with the book's copy.
        encoded = _encode(self.text)
        object.__setattr__(self, "digest", _page_digest(encoded))
        object.__setattr__(self, "size", len(encoded))


class PageBook(Protocol):
    """Pages seen before, found by their raw text; the owner bounds what it keeps."""

    def get(self, text: str) -> KnownPage | None:
        """The page whose raw text is ``text``, if kept."""

    def add(self, page: KnownPage) -> KnownPage:
        """Keep ``page`` (or not); return the copy to use: one already kept for its text."""


def read_page(text: str, book: PageBook | None = None) -> KnownPage | None:
    """The page whose raw result text is ``text``: from ``book``, or parsed now and added to it.

    None when ``text`` is not a well-formed page on its own (not JSON, more than one value, no
    ``tools`` array): the frame must then take the normal way, parsed whole.
    """
    known = None if book is None else book.get(text)
    if known is not None:
        return known
    try:
        result = _parse(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
        return None
    page = KnownPage(text, result.get("nextCursor"))
    return page if book is None else book.add(page)


def _encode(raw: str) -> bytes:
    return raw.encode("utf-8", "surrogatepass")


def _page_digest(encoded: bytes) -> bytes:
    """What ``ToolCatalog.digest`` takes of a page: the SHA-256 of its raw text (UTF-8). The one
    place a page is hashed (tests count calls)."""
    return hashlib.sha256(encoded).digest()


def _parse(text: str) -> Any:
    """Parse one page's raw result text (the one place pages are parsed: tests count calls)."""
    return envelope.parse_json(text)


class Entries(Sequence[object]):
    """A listing's tool entries in device order, exactly as sent.

    Pages kept as their raw text are parsed on first use: a stock frame around the same text
    parses into the same entries, and a device whose catalogue is known is never parsed.
    """

    def __init__(self, pages: Sequence[Page]) -> None:
        self._pages: Sequence[Page] | None = pages
        self._entries: tuple[object, ...] = ()

    def _all(self) -> tuple[object, ...]:
        if self._pages is not None:
            self._entries = tuple(e for page in self._pages for e in _entries_of(page))
            self._pages = None
        return self._entries

    def __len__(self) -> int:
        return len(self._all())

    def __getitem__(self, index: Any) -> Any:
        return self._all()[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Entries | tuple):
            return self._all() == tuple(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"Entries({self._all()!r})"


def _entries_of(page: Page) -> list[object]:
    if isinstance(page, list):
        return page
    tools: list[object] = _parse(page)["tools"]  # a KnownPage's text: checked when it was read
    return tools


class ToolCatalog:
    """One listing in progress: the tools gathered so far and the page to request next.

    The first page counts as requested when the catalogue is made. After each ``add_page`` (or
    ``add_known``), ``next_cursor`` is the cursor of the page to request, or None when the
    listing is over; ``complete`` turns False when it ended before the device's last page.
    """

    def __init__(self, max_pages: int, book: PageBook | None = None) -> None:
        """Start a listing that may request at most ``max_pages`` pages.

        ``book`` holds pages seen before (``stock_page``); it is shared between sessions.
        """
        self._max_pages = max_pages
        self._book = book
        self._pages = 1
        self._cursors: set[str] = set()
        self._tools: list[Page] = []
        # Over each page's digest (of its raw result text); None once a page came without it.
        self._hasher: Any = hashlib.sha256(b"tools/list pages\n")
        self.next_cursor: str | None = None
        self.complete = True
        self.request_id: int | None = None  # the page request awaiting its reply, if any

    @property
    def tools(self) -> Entries:
        """The tool entries gathered so far, in device order, unjudged."""
        return Entries(self._tools)

    @property
    def digest(self) -> str | None:
        """A digest of the raw results the entries came from: equal digests, equal entries.

        None unless every page's raw result text was given (``add_page``'s ``raw``).
        """
        return None if self._hasher is None else self._hasher.hexdigest()

    def stock_page(self, text: str, session_id: str, max_bytes: int) -> KnownPage | None:
        """The page a frame brings, read without parsing the frame, if it is a plain one.

        That is: ``text`` is a stock-framed reply (``envelope.result_text``) to ``request_id``,
        with ``session_id`` or the empty one devices use before any hello, no longer than
        ``max_bytes``, and its result is a well-formed page on its own (``read_page``). Any
        other frame gives None and must take the normal way (``envelope.decode``).
        """
        if self.request_id is None or len(text) > max_bytes:  # characters: no more than bytes
            return None
        raw = envelope.result_text(text, session_id, self.request_id)
        if raw is None:
            raw = envelope.result_text(text, "", self.request_id)
        if raw is None:
            return None
        page = read_page(raw, self._book)
        if page is None or len(text) - len(raw) + page.size > max_bytes:  # the frame is ASCII
            return None  # around the page, which the book measured once
        return page

    def add_known(self, page: KnownPage) -> list[MessageDropped]:
        """Take a page that ``stock_page`` read: kept as its text, hashed as ``add_page`` would.

        Returns:
            The ``MessageDropped`` that says why the listing stopped early, if it did.
        """
        self._tools.append(page.text)
        if self._hasher is not None:
            self._hasher.update(page.digest)
        return self._next(page.next_cursor)

    def add_page(self, result: object, raw: str | None = None) -> list[MessageDropped]:
        """Take one page's ``tools/list`` result and decide on the next page.

        Args:
            result: the ``result`` of the device's reply.
            raw: the text ``result`` was parsed from, alone (``envelope.result_text``), if known.

        Returns:
            The ``MessageDropped`` that says why the listing stopped early, if it did.
        """
        if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
            return [self.stop("malformed tools/list result")]
        self._tools.append(result["tools"])
        if raw is None:
            self._hasher = None
        elif self._hasher is not None:
            self._hasher.update(_page_digest(_encode(raw)))
        return self._next(result.get("nextCursor"))

    def add_reply(
        self, reply: Response | ErrorResponse, raw: str | None = None
    ) -> list[MessageDropped]:
        """Take the device's reply to a ``tools/list`` request: a page, or why there is none.

        ``raw`` is the text of its result (``add_page``).
        """
        if isinstance(reply, ErrorResponse):
            return [self.stop(f"tools/list failed: {reply.message}", {"code": reply.code})]
        return self.add_page(reply.result, raw)

    def stop(self, reason: str, detail: JsonObject | None = None) -> MessageDropped:
        """End the listing early and return the ``MessageDropped`` that says why."""
        self.next_cursor = None
        self.complete = False
        return MessageDropped(reason, {"pages": self._pages, **(detail or {})})

    def _next(self, cursor: object) -> list[MessageDropped]:
        self.request_id = None
        try:
            self.next_cursor = self._follow(cursor)
        except _Stop as exc:
            return [self.stop(str(exc))]
        return []

    def _follow(self, cursor: object) -> str | None:
        # An empty string is how some servers spell "no more pages".
        if cursor is None or cursor == "":
            return None
        if not isinstance(cursor, str):
            raise _Stop("malformed nextCursor")
        if cursor in self._cursors:
            raise _Stop("tools/list cursor loop")
        if self._pages >= self._max_pages:
            raise _Stop(f"tools/list stopped after {self._max_pages} pages")
        self._cursors.add(cursor)
        self._pages += 1
        return cursor
