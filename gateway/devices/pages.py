"""The ``tools/list`` pages devices sent lately, shared by every session (``PageBook``).

Devices of one firmware send the same pages, byte for byte. The protocol reads a stock-framed
page through this book (``gateway.protocol.catalog.read_page``): a page kept here is taken as it
is, not parsed, and every session listing it holds this one copy of its text instead of a copy
of its own. In a storm of a thousand joins of one firmware, its pages are parsed once.

What a device sends is not trusted to be small or few: the book keeps pages of at most
``max_size`` in all (a page's text in UTF-8 bytes and its digest, ``KnownPage.digest``), and
forgets the least recently used first. A page forgotten costs only a parse when it comes again.
"""

from __future__ import annotations

from collections import OrderedDict

from gateway.protocol.catalog import KnownPage

__all__ = ["KnownPages"]

# A few firmwares' pages (about 8 KB each by the stock page rule) and room to spare.
DEFAULT_MAX_SIZE = 4 << 20


class KnownPages:
    """A bounded book of pages by their raw text, least recently used forgotten first."""

    def __init__(self, max_size: int = DEFAULT_MAX_SIZE) -> None:
        """Keep pages of at most ``max_size`` in all: their texts' UTF-8 bytes and digests."""
        self._pages: OrderedDict[str, KnownPage] = OrderedDict()
        self._size = 0
        self._max_size = max_size

    def __len__(self) -> int:
        return len(self._pages)

    def get(self, text: str) -> KnownPage | None:
        """The page whose raw text is ``text``, if kept."""
        page = self._pages.get(text)
        if page is not None:
            self._pages.move_to_end(text)
        return page

    def add(self, page: KnownPage) -> KnownPage:
        """Keep ``page``, forgetting the oldest pages beyond the bound; return the kept copy."""
        kept = self._pages.get(page.text)
        if kept is not None:
            return kept
        size = _size(page)
        if size > self._max_size:
            return page  # kept by the listing that read it, and no one else
        self._pages[page.text] = page
        self._size += size
        while self._size > self._max_size:
            _, forgotten = self._pages.popitem(last=False)
            self._size -= _size(forgotten)
        return page


def _size(page: KnownPage) -> int:
    return page.size + len(page.digest)  # UTF-8 bytes: never fewer than the text's own storage
