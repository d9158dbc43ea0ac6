"""docs/protocol.md: every section the code cites exists, under the number it is cited by.

The code cites the device protocol as ``<file> §N`` or ``§N.M`` (``device_fw`` writes ``<file> N``
without the sign); until every citation names docs/protocol.md, the old file name counts too.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "protocol.md"
SOURCES = ["gateway", "device_fw", "tests", "bench", "docs", "README.md"]
# The old name is spelt in two parts, so that rewriting the citations leaves this file alone.
CITED_FILE = r"(?:" + "xiaozhi-" + r"protocol|docs/protocol)\.md`?"
CITATION = re.compile(
    CITED_FILE + r"[ ,]*(?:§ ?)?(\d+(?:\.\d+)?)((?:,? ?(?:and )?§\d+(?:\.\d+)?)*)"
)
MORE = re.compile(r"§(\d+(?:\.\d+)?)")


def sections() -> set[str]:
    found = set()
    for line in DOC.read_text().splitlines():
        if heading := re.match(r"#{2,3} (\d+(?:\.\d+)?)\.? ", line):
            found.add(heading.group(1))
    return found


def citations() -> dict[str, set[str]]:
    cited: dict[str, set[str]] = {}
    for source in SOURCES:
        paths = [ROOT / source] if source.endswith(".md") else (ROOT / source).rglob("*")
        for path in paths:
            if path.suffix not in (".py", ".md", ".pyi") or path == DOC:
                continue
            for match in CITATION.finditer(path.read_text()):
                numbers = [match.group(1), *MORE.findall(match.group(2))]
                for number in numbers:
                    cited.setdefault(number, set()).add(str(path.relative_to(ROOT)))
    return cited


def test_the_sections_are_numbered_from_0_to_8() -> None:
    top = {s for s in sections() if "." not in s}
    assert top == {str(n) for n in range(9)}


def test_every_cited_section_exists() -> None:
    cited = citations()
    assert {"1", "1.1", "2", "3", "4", "6", "7.1", "7.2", "7.3", "7.4"} <= set(cited)
    missing = {number: files for number, files in cited.items() if number not in sections()}
    assert not missing, f"cited but not in docs/protocol.md: {missing}"
