"""README.md stays a user guide, and CHANGELOG.md a changelog per release (issue 42)."""

from __future__ import annotations

import re
from pathlib import Path

from gateway import __version__

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()
MAX_README_BYTES = 20_000  # the "at most 20 KB"; detail belongs in docs/


def test_the_readme_stays_a_short_guide() -> None:
    size = len(README.encode())
    assert size <= MAX_README_BYTES, f"README.md is {size} bytes: move detail to docs/"


def test_the_readme_starts_with_the_two_commands() -> None:
    quick = README[README.index("## Quick start") :]
    start = quick.index("```sh\n") + 6
    block = quick[start : quick.index("\n```", start)]
    assert block.splitlines() == [
        "# Run the gateway: no config file, no broker, nothing else needed.",
        "python3 -m venv .venv && .venv/bin/pip install -q . && .venv/bin/esp-mcp-gateway serve",
        "",
        "# Run the whole test suite (sets up .venv with the test tools on first run).",
        "scripts/test",
    ]


def test_every_file_the_readme_links_to_exists() -> None:
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README):
        assert (ROOT / target).exists(), f"README.md links to {target}, which is not there"


def test_every_doc_is_in_the_readme_s_index() -> None:
    index = README[README.index("## Documentation") :]
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{doc.name})" in index, f"docs/{doc.name} is not in the README's index"


def test_the_changelog_has_this_version_under_unreleased() -> None:
    headings = re.findall(r"^## (.*)$", CHANGELOG, re.M)
    assert headings[0] == "[Unreleased]"
    assert re.fullmatch(rf"\[{re.escape(__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}", headings[1])
    assert "## [0.1.0]" in CHANGELOG
    # Each release says what it added, changed, fixed...: Keep a Changelog's groups only.
    groups = set(re.findall(r"^### (.*)$", CHANGELOG, re.M))
    assert groups <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
