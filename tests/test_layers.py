"""Imports follow the data path of docs/architecture.md; the protocol core does no I/O.

Data flows device side -> core -> host side. Every top-level module and subpackage of gateway/
(a *unit*) sits in exactly one layer of ``LAYERS``, from the foundation that everything may use
to the entry points. A module may import its own unit and the units of earlier layers: never a
later layer, and never another unit of its own layer, so the two sides, which share a layer,
reach each other only through the core. Inside each package of ``INNER`` the same rule holds one
level down, and no module anywhere imports itself back through a circle.
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
    {"compat"},  # other libraries' private names, one module per library; nothing of ours
    {"errors"},
    {"config", "datadir", "launch"},  # settings; the data dir kept private; how we were run
    {"net"},  # where clients connect: addresses, listener limits, request rates
    {"protocol"},  # the core, sans-I/O: envelope, JSON-RPC, the device state machine
    {"devices"},  # the core, with I/O: connections, registry, calls, catalogues, audit, photos
    {"device_side", "host_side"},  # devices connect here / hosts and people connect here
    {"cluster"},  # replicas on an MQTT broker cluster: over both sides, composed by app
    {"app"},  # composes the two sides over the core
    {"simulator"},  # runs device_fw as a peer: imports nothing of the gateway
    {"cli"},  # the operator: commands, doctor, flashing
    {"__main__"},
]
# One level down: the modules of a package, in the order they may import each other.
INNER: dict[str, list[set[str]]] = {
    # one module per library, none importing another
    "compat": [{"aiomqtt", "mcp_sdk", "starlette", "stdlib", "uvicorn"}],
    "net": [
        # direct_http: small POSTs answered below ASGI; expiries: deadlines of one length on
        # one timer; peer: the socket's address, kept before uvicorn's proxy headers replace
        # it; text_frames: where a WebSocket's frames begin, and plain text frames;
        # networks: addresses and networks from the config, and this machine's interfaces'
        {
            "direct_http",
            "expiries",
            "networks",
            "peer",
            "text_frames",
            "throttled",
        },
        {"addresses", "destinations", "websocket", "upgrade"},
        {"limits"},
        {"public", "descriptors", "rate_limit", "listeners"},
    ],
    "protocol": [
        {"envelope", "events", "states", "mqtt"},  # mqtt: the broker's packets
        {"jsonrpc", "mqtt_reader"},
        # a session's parts, no state machine (timing: its deadline, and the listings' pace)
        # device_log: a device's logging notification made its event
        {"catalog", "outbox", "outgoing", "pending", "timing", "device_log"},
        {"device"},  # DeviceProtocol: the whole state machine
    ],
    "devices": [
        {"name_rules", "subscribers"},  # how one MCP name is spelled; callbacks told of events
        {"broadcast", "catalogue", "link", "naming", "photos", "audit", "tokens", "policy"},
        {"deadlines", "rates"},  # timeouts on timers shared by their length; callers' rates
        {"token_joins"},  # the shared token's caps on new devices
        {"pages", "store_layout"},  # pages: the tools/list pages seen lately, shared by sessions
        {"store", "logins", "fleet_naming"},  # logins: refused and conflicting device logins
        {"device"},  # a known device and its tools as decided
        {"exposure", "limits"},  # what hosts see; the owner's limits on arguments
        {"decisions"},  # the policy's verdicts on a catalogue's tools, once per catalogue
        {"known"},  # the registry's state: the devices, records, names, what hosts see
        {"admin"},  # the user's decisions on it: approval, binding, names, forgetting
        {"registry", "enrollment"},  # DeviceRegistry: the connections' updates, the facade
        {"events"},  # what devices report on their own, kept per device
        {"connection", "confirm_rules"},  # confirm_rules: which tools wait for the owner's yes
        {"confirmations"},  # the calls waiting for it
        {"calls"},
        {"messages"},  # notify_device: the alert frame within the owner's limits
    ],
    "cluster": [
        {"records", "replica", "broker_auth", "catalogues"},
        # cache: the fleet kept in the data dir; boards: which replica holds each board
        {"client", "remote", "bridge", "live", "cache", "boards"},
        {"fleet_state"},  # the fleet as this replica knows it: records, presences, replicas
        {"fleet_records"},  # the records kept in step with the registry, in and out
        {"fleet"},  # the fleet service: the records, the remote devices, the replicas
    ],
    "device_side": [
        {"broker", "vision"},
        {"upstream"},  # beside a voice server: the tap, the relay, the OTA and camera forwards
        {"ota_rules"},  # what a check-in says and a reply may say
        {"ota", "transports"},
        {"admission", "sessions"},
        {"http", "boards"},  # boards: devices that serve MCP themselves, the gateway their client
    ],
    "host_side": [
        # tool_groups: grouped mode's groups, kept device by device for tool_listing;
        # device_scope: which devices a caller may see and call
        {"tool_groups", "device_scope"},
        {
            "tool_listing",
            "device_listing",
            "photo_resources",
            "relay",
            "call_results",
            "fleet_app",
            "callers",
            "front",  # /mcp straight to its guards, past Starlette's layers
            "json_answers",  # a POST's lone result as JSON, not a stream
        },
        # confirm_asks: the owner's yes asked in the host (elicitation, the panel);
        # messages_tool: notify_device; event_resources: devices' events (resources,
        # subscriptions, wait_for_event)
        {"confirm_asks", "messages_tool", "event_resources"},
        {"channels"},  # Claude Code channels (stdio)
        {"mcp_server"},
        {"dashboard", "metrics"},
        {"oauth", "api"},  # OAuth: its consent page signs in as the dashboard; api: /api/*
        {"waiting_calls"},  # the calls waiting for a yes: their /api/calls
        {"http"},
    ],
    "host_side/oauth": [
        {"origin", "store", "redirects", "device_choice"},
        {"client_documents", "credentials", "consent_requests", "guard"},
        {"provider"},
        {"consent"},
        {"site"},
        {"apps"},
    ],
    "cli": [
        {"gateway_api", "help", "heap", "tables", "log_lines"},
        {"flashing", "doctor"},
        {"commands"},
        {"calls"},  # the calls waiting for a yes, over commands' requests
    ],
    "config": [
        {"values", "tool_limits"},  # tool_limits: the shape of a device's limits and rates
        {"listen", "boards", "quiet", "host_tokens"},
        {"model"},
        {"keys"},
        {"unknown_keys"},
        {"loading"},
    ],
    "cli/doctor": [
        {"probes"},
        {"findings"},
        {"remote"},  # the remote URL, which the device URL's check compares with
        {"listeners", "broker", "data_dir", "upstream", "config_file"},
    ],
    "device_side/transports/mqtt": [
        {"failover"},
        {"client", "link", "local"},  # local: the in-process client of the embedded broker
        {"liveness"},
        {"stalls"},  # calls to a device gone with its broker node
        {"transport"},
    ],
    "device_side/boards": [{"address", "http", "link", "discovery"}, {"board"}, {"fleet"}],
}
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


def imported_units(path: Path, package: Path = PACKAGE, root: Path | None = None) -> set[str]:
    """The units of ``package`` that ``path`` imports: relative, lazy and TYPE_CHECKING ones too.

    ``root`` is the folder that holds the top-level package (``package.parent`` by default), so
    ``package`` may be a subpackage such as gateway/net, whose units are its own modules.
    """
    root = package.parent if root is None else root
    prefix = list(package.relative_to(root).parts)
    known = units(package)
    here = list(path.relative_to(root).parent.parts)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = base + (node.module.split(".") if node.module else [])
            if module == prefix:  # from gateway import __version__, commands
                found.update(a.name if a.name in known else "__init__" for a in node.names)
                continue
            targets = [module]
        else:
            continue
        depth = len(prefix)
        found.update(
            p[depth] if len(p) > depth else "__init__" for p in targets if p[:depth] == prefix
        )
    return found


def module_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Every module of ``package`` (dotted) and the modules of ``package`` it imports."""
    root = package.parent
    modules = {
        ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): path
        for path in package.rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = list(path.relative_to(root).parent.parts)
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                module = ".".join(base + (node.module.split(".") if node.module else []))
                # from a package, a name is its submodule where one exists, else the package's
                targets = [
                    f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module
                    for a in node.names
                ]
            else:
                continue
            edges.update(target for target in targets if target in modules and target != name)
        graph[name] = edges
    return graph


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


@pytest.mark.parametrize("package", sorted(INNER))
def test_inner_units_are_placed_once(package: str) -> None:
    """INNER places every module of each side package exactly once."""
    placed = [unit for layer in INNER[package] for unit in layer]
    assert len(placed) == len(set(placed)), f"{package}: a unit is in more than one layer"
    found = units(PACKAGE / package) - {"__init__"}
    assert set(placed) == found, f"{package}: INNER lists {sorted(placed)}, found {sorted(found)}"


@pytest.mark.parametrize(
    ("package", "unit"),
    [
        (pkg, unit) for pkg, layers in INNER.items() for layer in layers for unit in sorted(layer)
    ],  # fmt: skip
)
def test_inner_imports_point_up(package: str, unit: str) -> None:
    """Inside a package, a module imports only modules of earlier inner layers."""
    order = {name: index for index, layer in enumerate(INNER[package]) for name in layer}
    bad = []
    for path in modules_of(unit, PACKAGE / package):
        for other in sorted(imported_units(path, PACKAGE / package, PACKAGE.parent) - {unit}):
            if other != "__init__" and order.get(other, len(order)) >= order[unit]:
                bad.append(f"{path.relative_to(PACKAGE.parent)} imports {package}.{other}")
    assert not bad, f"{package}.{unit} may only import earlier inner layers: {bad}"


def test_no_import_circles() -> None:
    """No module of gateway/ imports itself back through other modules (TYPE_CHECKING too)."""
    graph = module_graph()
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                circles.append([*path[path.index(other) :], other])
            elif other not in state:
                visit(other, [*path, other])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, f"import circles: {circles}"


def test_module_graph_finds_a_circle(tmp_path: Path) -> None:
    """The circle check sees a circle made through a TYPE_CHECKING import."""
    package = tmp_path / "gateway"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("from gateway.sub.b import B\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway.sub import a\n"
    )
    graph = module_graph(package)
    assert graph["gateway.sub.a"] == {"gateway.sub.b"}
    assert graph["gateway.sub.b"] == {"gateway.sub.a"}
