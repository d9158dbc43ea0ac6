"""server.json, the MCP Registry entry: valid against the registry's schema, and in step.

The schema is vendored (tests/vectors/mcp-registry/, from modelcontextprotocol/registry): CI
reaches package registries only.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema_rs

from gateway import __version__

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "tests" / "vectors" / "mcp-registry" / "server.schema.json"


def entry() -> dict[str, object]:
    loaded: dict[str, object] = json.loads((ROOT / "server.json").read_text())
    return loaded


def test_server_json_is_valid_against_the_registry_schema() -> None:
    schema = json.loads(SCHEMA.read_text())
    assert entry()["$schema"] == schema["$id"]
    errors = [e.message for e in jsonschema_rs.validator_for(schema).iter_errors(entry())]
    assert not errors


def test_server_json_names_this_version_and_both_packages() -> None:
    server = entry()
    packages = {p["registryType"]: p for p in server["packages"]}  # type: ignore[attr-defined]
    assert set(packages) == {"pypi", "oci"}
    assert packages["pypi"]["identifier"] == "esp-mcp-gateway"
    assert {server["version"], *(p["version"] for p in packages.values())} == {__version__}


def test_the_readme_proves_ownership_of_the_pypi_package() -> None:
    """The registry accepts a PyPI package whose README says ``mcp-name: <server name>``."""
    assert f"mcp-name: {entry()['name']}" in (ROOT / "README.md").read_text()
