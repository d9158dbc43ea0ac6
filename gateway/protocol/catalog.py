"""Gathering a device's ``tools/list`` pages into one catalogue.

``ToolCatalog`` holds one listing in progress: it collects every page's tool entries as the
device sent them, follows ``nextCursor`` and refuses cursor loops and runaway page counts. Judging
the entries (names, texts, schemas) is the device layer's business (``gateway.devices.catalogue``):
it must decide tool by tool, and it shares the verdict between devices with the same firmware.
When to request a page and what state that puts the session in is ``DeviceProtocol``'s business.

Devices of the same firmware list the same entries, and the device layer shares one judged
catalogue between them, found by a digest of the entries. Hashing the pages' raw text as they
arrive (``digest``) costs a fraction of serialising every parsed entry again to hash it. A page
whose frame is known is kept as that text, not as parsed entries (a third of the memory, in a
storm of joins where every device is listing at once), and parsed again only if the device
layer does not know its catalogue yet (``Entries``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from gateway.protocol.events import MessageDropped
from gateway.protocol.jsonrpc import ErrorResponse, Response

__all__ = ["Entries", "ToolCatalog"]

JsonObject = dict[str, Any]


class _Stop(Exception):
    """The listing must end before the device's last page; the text says why."""


Page = list[object] | str  # a page's tool entries, or the text of the frame they came in


class Entries(Sequence[object]):
    """A listing's tool entries in device order, exactly as sent.

    Pages kept as their frame's text are parsed again on first use: the same text through the
    same parser gives the same entries, and a device whose catalogue is known is never parsed.
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
    # As DeviceProtocol parsed the frame (envelope.decode), down to the reply's result.
    tools: list[object] = json.loads(page, strict=False)["payload"]["result"]["tools"]
    return tools


class ToolCatalog:
    """One listing in progress: the tools gathered so far and the page to request next.

    The first page counts as requested when the catalogue is made. After each ``add_page``,
    ``next_cursor`` is the cursor of the page to request, or None when the listing is over;
    ``complete`` turns False when it ended before the device's last page.
    """

    def __init__(self, max_pages: int) -> None:
        """Start a listing that may request at most ``max_pages`` pages."""
        self._max_pages = max_pages
        self._pages = 1
        self._cursors: set[str] = set()
        self._tools: list[Page] = []
        # Over each page's raw result text, length first; None once a page came without it.
        self._hasher: Any = hashlib.sha256(b"tools/list results\n")
        self.next_cursor: str | None = None
        self.complete = True

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

    def add_page(
        self, result: object, raw: str | None = None, frame: str | None = None
    ) -> list[MessageDropped]:
        """Take one page's ``tools/list`` result and decide on the next page.

        Args:
            result: the ``result`` of the device's reply.
            raw: the text ``result`` was parsed from, alone (``envelope.result_text``), if known.
            frame: the whole frame's text, if ``result`` is its ``payload.result``: kept
                instead of the entries while ``raw`` names them (``Entries``).

        Returns:
            The ``MessageDropped`` that says why the listing stopped early, if it did.
        """
        if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
            return [self.stop("malformed tools/list result")]
        self._tools.append(frame if frame is not None and raw is not None else result["tools"])
        if raw is None:
            self._hasher = None
        elif self._hasher is not None:
            self._hasher.update(f"{len(raw)}:{raw}".encode("utf-8", "surrogatepass"))
        try:
            self.next_cursor = self._follow(result.get("nextCursor"))
        except _Stop as exc:
            return [self.stop(str(exc))]
        return []

    def add_reply(
        self, reply: Response | ErrorResponse, raw: str | None = None, frame: str | None = None
    ) -> list[MessageDropped]:
        """Take the device's reply to a ``tools/list`` request: a page, or why there is none.

        ``raw`` and ``frame`` are the texts of its result and of its whole frame (``add_page``).
        """
        if isinstance(reply, ErrorResponse):
            return [self.stop(f"tools/list failed: {reply.message}", {"code": reply.code})]
        return self.add_page(reply.result, raw, frame)

    def stop(self, reason: str, detail: JsonObject | None = None) -> MessageDropped:
        """End the listing early and return the ``MessageDropped`` that says why."""
        self.next_cursor = None
        self.complete = False
        return MessageDropped(reason, {"pages": self._pages, **(detail or {})})

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
