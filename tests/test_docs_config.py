"""Every TOML snippet in docs/ is a config the gateway loads: no key the docs name is refused."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from gateway.config import load_config
from tests.programs import ROOT

_SNIPPET = re.compile(r"^[ \t]*```toml\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)


def snippets() -> list[tuple[str, str]]:
    """Each ```toml block of docs/*.md: (where, text)."""
    found = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        text = doc.read_text()
        for match in _SNIPPET.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{doc.name}:{line}", textwrap.dedent(match.group(1))))
    return found


@pytest.mark.parametrize(("where", "snippet"), snippets(), ids=[w for w, _ in snippets()])
def test_a_docs_toml_snippet_loads_with_the_real_config_loader(
    where: str, snippet: str, tmp_path: Path
) -> None:
    """The snippet, as a config file of its own, loads (unknown keys and bad values refused)."""
    path = tmp_path / "gateway.toml"
    path.write_text(snippet)
    load_config(path, env={"GATEWAY_DATA_DIR": str(tmp_path / "data")})


def test_the_docs_have_toml_snippets() -> None:
    """The check above sees the docs' snippets (a moved docs/ would pass it silently)."""
    assert len(snippets()) >= 5
