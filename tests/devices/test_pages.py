"""Tests for gateway.devices.pages: the bounded book of pages shared by device sessions."""

from __future__ import annotations

from gateway.devices.pages import KnownPages
from gateway.protocol.catalog import KnownPage


def test_the_book_gives_one_copy_of_a_page_to_every_reader() -> None:
    """A page added twice (two devices' own copies of its text) is kept once: the second
    reader gets the first copy, and the book finds it by equal text."""
    book = KnownPages()
    first = KnownPage("".join(['{"tools":', "[]}"]), None)
    again = KnownPage('{"tools":[]}', None)
    assert book.add(first) is first and book.add(again) is first
    assert book.get('{"tools":[]}') is first
    assert book.get("other") is None and len(book) == 1


def test_the_book_forgets_the_least_recently_used_pages_beyond_its_bound() -> None:
    """What devices send cannot fill the gateway: the oldest unused pages go first."""
    book = KnownPages(max_size=3 * 42)  # a page: 10 characters, and its 32-byte digest
    pages = [KnownPage(f"page-{n}-".ljust(10, "x"), None) for n in range(3)]
    for page in pages:
        book.add(page)
    assert book.get(pages[0].text) is pages[0]  # used: now the most recent
    book.add(KnownPage("page-3-xxx", None))
    assert [book.get(p.text) is not None for p in pages] == [True, False, True]
    assert book.get("page-3-xxx") is not None and len(book) == 3


def test_a_page_larger_than_the_book_is_not_kept() -> None:
    """A page over the whole bound is read for its listing, and evicts nothing."""
    book = KnownPages(max_size=40)
    small = book.add(KnownPage("small", None))  # 5 + 32
    huge = KnownPage("h" * 10, None)  # 10 + 32
    assert book.add(huge) is huge
    assert book.get(huge.text) is None and book.get("small") is small


def test_the_bound_counts_a_page_in_utf8_bytes() -> None:
    """Characters outside ASCII take more room than one each: the bound is in UTF-8 bytes (at
    least what CPython keeps of the text), so such pages cannot hold four times the bound."""
    book = KnownPages(max_size=2 * (40 + 32))
    wide = [KnownPage(f"{n}" + "\U0001f600" * 9, None) for n in range(3)]  # 1 + 36 bytes each
    assert wide[0].size == 37
    for page in wide:
        book.add(page)
    assert len(book) == 1 + 1 and book.get(wide[0].text) is None  # two fit, the first went
