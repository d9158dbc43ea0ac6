"""Every subcommand's --help says in a line what it does and shows it run (issue 42)."""

from __future__ import annotations

import argparse

from gateway.cli import _parser


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = _parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_subcommand_has_a_description_and_an_example() -> None:
    commands = subcommands()
    assert {"serve", "stdio", "devices", "call", "enrollments", "flash", "doctor"} <= set(commands)
    for name, parser in commands.items():
        text = parser.format_help()
        description = text.split("\n\n")[1]
        assert description.strip(), name
        assert parser.description and parser.description.endswith("."), name
        example = text[text.index("\nexample") :]
        assert f"  esp-mcp-gateway {name}" in example, name
