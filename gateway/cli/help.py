"""Every subcommand's ``--help``: a one-line description and an example to copy."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

__all__ = ["add_command"]


def add_command(
    sub: Any, name: str, summary: str, example: str, parents: Sequence[argparse.ArgumentParser] = ()
) -> argparse.ArgumentParser:
    """A subcommand whose help lists it as ``summary`` and shows it run as ``example``.

    ``example``: the command line after ``esp-mcp-gateway``; lines of their own for several.
    """
    lines = example.splitlines()
    examples = "\n".join(f"  esp-mcp-gateway {line}" for line in lines)
    return sub.add_parser(  # type: ignore[no-any-return]
        name,
        parents=list(parents),
        help=summary,
        description=summary[0].upper() + summary[1:] + ".",
        epilog=f"{'examples' if len(lines) > 1 else 'example'}:\n{examples}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
