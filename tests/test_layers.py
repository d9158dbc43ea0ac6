"""Imports point up the layers of STYLE.md §2; the protocol core does no I/O.

Every top-level module and subpackage of gateway/ (a *unit*) sits in exactly one layer of
``LAYERS``, which runs from the foundation that everything may use to the entry points. A module
may import its own unit and the units of earlier layers: never a later layer, and never another
unit of its own layer (units that share a layer are independent of each other). STYLE.md §2 draws
the same order top-down, with the arrows pointing at what is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gateway"
IO_MODULES = {"asyncio", "anyio", "socket", "starlette", "uvicorn", "websockets", "paho", "mcp",
              "sqlite3", "httpx2"}  # fmt: skip

LAYERS: list[set[str]] = [
    {"__init__"},  # gateway/__init__.py: __version__ only; it runs before any other module
    {"errors"},
    {"config", "datadir"},  # settings; the data dir kept private
    # where clients connect; audit log, fan-out, listener limits, names, photos, tokens
    {"addresses", "audit", "broadcast", "limits", "naming", "photos", "tokens"},
    {"protocol"},  # sans-I/O core
    {"devices"},  # connections, registry, calls, enrollment
    # MQTT broker; what hosts see of devices; request rates; running out of descriptors
    {"broker", "descriptors", "device_listing", "photo_resources", "rate_limit", "tool_listing"},
    {"mcp_server", "ota", "transports", "vision"},
    {"dashboard", "metrics"},  # the companion dashboard at /, and /metrics
    {"host_app"},
    {"app"},
    {"doctor", "flashing", "relay", "simulator"},  # what the CLI runs besides the gateway
    {"commands"},
    {"cli"},
    {"__main__"},
]
LAYER = {unit: index for index, layer in enumerate(LAYERS) for unit in layer}


def units(package: Path = PACKAGE) -> set[str]:
    """The modules (``__init__`` included) and subpackages found in ``package``."""
    found = {path.stem for path in package.glob("*.py")}
    found.update(p.name for p in package.iterdir() if p.is_dir() and any(p.rglob("*.py")))
    return found


def modules_of(unit: str, package: Path = PACKAGE) -> list[Path]:
    """The source files of ``unit``."""
    if (package / unit).is_dir():
        return sorted((package / unit).rglob("*.py"))
    return [package / f"{unit}.py"]


def imports_of(path: Path) -> set[str]:
    """Every module name ``path`` imports, as written."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def imported_units(path: Path, package: Path = PACKAGE) -> set[str]:
    """The units of ``package`` that ``path`` imports: relative, lazy and TYPE_CHECKING ones too."""
    known = units(package)
    here = [package.name, *path.relative_to(package).parent.parts]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = base + (node.module.split(".") if node.module else [])
            if module == [package.name]:  # from gateway import __version__, commands
                found.update(a.name if a.name in known else "__init__" for a in node.names)
                continue
            targets = [module]
        else:
            continue
        found.update(p[1] if len(p) > 1 else "__init__" for p in targets if p[0] == package.name)
    return found


def test_every_unit_is_placed_once() -> None:
    """LAYERS places every unit of gateway/ exactly once, and nothing that no longer exists."""
    placed = [unit for layer in LAYERS for unit in layer]
    assert len(placed) == len(set(placed)), "a unit is in more than one layer"
    assert set(placed) - units() == set(), "LAYERS names units that gateway/ no longer has"
    assert units() - set(placed) == set(), "new units of gateway/: add them to LAYERS"


@pytest.mark.parametrize("unit", sorted(LAYER))
def test_imports_point_up(unit: str) -> None:
    """No module imports from a unit of its own layer or of a later one."""
    bad = []
    for path in modules_of(unit):
        for other in sorted(imported_units(path) - {unit}):
            if LAYER.get(other, len(LAYERS)) >= LAYER[unit]:
                where = LAYER.get(other, "none")
                bad.append(f"{path.relative_to(PACKAGE.parent)} imports gateway.{other} ({where})")
    assert not bad, f"{unit} (layer {LAYER[unit]}) may only import earlier layers: {bad}"


def test_simulator_runs_only_firmware_code() -> None:
    """The simulator imports nothing of the gateway: it runs device_fw, an independent peer."""
    for path in modules_of("simulator"):
        assert imported_units(path) <= {"simulator"}, f"{path.name} imports the gateway"


def test_imported_units_resolves_every_form(tmp_path: Path) -> None:
    """Absolute, relative, ``from gateway import`` and nested imports all count."""
    package = tmp_path / "gateway"
    (package / "sub").mkdir(parents=True)
    for name in ("__init__.py", "config.py", "commands.py", "errors.py", "sub/peer.py"):
        (package / name).write_text("")
    module = package / "sub" / "mod.py"
    module.write_text(
        "import gateway.config\n"
        "from gateway import __version__, commands\n"
        "from . import peer\n"
        "from .. import errors\n"
        "def lazy() -> None:\n"
        "    from gateway.app import build\n"
    )
    found = imported_units(module, package)
    assert found == {"config", "__init__", "commands", "sub", "errors", "app"}


def test_protocol_core_does_no_io() -> None:
    """gateway/protocol imports nothing that does I/O (STYLE.md rule 1)."""
    for path in modules_of("protocol"):
        for name in imports_of(path):
            assert name.split(".")[0] not in IO_MODULES, f"{path.name} imports {name}"
