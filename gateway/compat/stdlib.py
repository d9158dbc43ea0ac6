"""The standard library's private names: argparse's actions, logging's caller lookup.

Checked with CPython 3.11.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator

__all__ = ["actions", "skip_caller_lookup", "subcommand_parsers"]


def actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every argument ``parser`` was given (``_actions``: argparse names no public list of them)."""
    return parser._actions


def subcommand_parsers(action: argparse.Action) -> Iterator[argparse.ArgumentParser]:
    """The subcommands' parsers, if ``action`` is what ``add_subparsers()`` returned.

    That class, ``argparse._SubParsersAction``, is private; its ``choices`` map each name to its
    parser.
    """
    if isinstance(action, argparse._SubParsersAction):
        yield from action.choices.values()


def skip_caller_lookup() -> None:
    """Let logging skip finding each record's file, line and function.

    The logging HOWTO's "Optimization" says so: set ``logging._srcfile`` to None. Worth it where
    the format shows none of them (3% of a storm of joins went to the lookup).
    """
    logging._srcfile = None
