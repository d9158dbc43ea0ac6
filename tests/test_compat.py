"""The private names gateway/compat borrows are still where and what the gateway expects, and no
module outside gateway/compat reaches into another library.

Each check names the library and the installed release in its message, so that a release that
moves a name fails here first, before the code that relies on it fails somewhere less plain
(the weekly workflow .github/workflows/newest-deps.yml runs this file first, against the
newest releases). It imports the gateway only inside its tests and runs without
tests/conftest.py (``pytest --noconftest tests/test_compat.py``), which imports all of it: a
name gone then fails its own check, by name, rather than every test at collection.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import importlib.metadata
import inspect
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import pytest
import uvicorn
from mcp.server import Server
from mcp.server.session import ServerSession
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.datastructures import FormData
from starlette.requests import Request

PACKAGE = Path(__file__).resolve().parent.parent / "gateway"
COMPAT = PACKAGE / "compat"


def moved(distribution: str, what: str, module: str) -> str:
    """The message of a check that failed: which release moved what, and what to look at."""
    if distribution == "python":
        release = f"Python {sys.version.split()[0]}"
    else:
        release = f"{distribution} {importlib.metadata.version(distribution)}"
    return f"{release}: {what} is not as gateway/compat/{module}.py expects; read it there"


# Every name gateway/compat binds when imported, checked without importing the gateway (which a
# release that moved one would stop at its first import): (distribution, module, name, compat).
BORROWED = [
    ("mcp", "mcp.server.streamable_http_manager", "StreamableHTTPSessionManager._discard_session",
     "mcp_sdk"),
    ("aiomqtt", "aiomqtt", "Client._pending_call", "aiomqtt"),
    ("aiomqtt", "aiomqtt", "Client._misc_loop", "aiomqtt"),
    ("uvicorn", "uvicorn.protocols.http.h11_impl", "H11Protocol", "uvicorn"),
    ("uvicorn", "uvicorn.protocols.websockets.websockets_sansio_impl", "WebSocketsSansIOProtocol",
     "uvicorn"),
    ("uvicorn", "uvicorn.server", "ServerState", "uvicorn"),
    ("python", "argparse", "_SubParsersAction", "stdlib"),
    ("python", "argparse", "ArgumentParser.add_subparsers", "stdlib"),
    ("python", "logging", "_srcfile", "stdlib"),
]  # fmt: skip


@pytest.mark.parametrize(("distribution", "module", "name", "compat"), BORROWED)
def test_borrowed_name_is_still_there(
    distribution: str, module: str, name: str, compat: str
) -> None:
    """Each name gateway/compat imports or binds exists in the installed release."""
    found: object = importlib.import_module(module)
    for part in name.split("."):
        assert hasattr(found, part), moved(distribution, f"{module}.{name}", compat)
        found = getattr(found, part)


def test_mcp_sdk_manager_keeps_its_sessions_and_owners() -> None:
    """The session manager's owners and transports are dicts by session id, and its own discard
    forgets a session from both (what revoking an app relies on)."""
    from gateway.compat import mcp_sdk

    manager = StreamableHTTPSessionManager(app=Server("compat"))
    where = "StreamableHTTPSessionManager._session_owners/_server_instances/_discard_session"
    assert isinstance(getattr(manager, "_session_owners", None), dict), moved(
        "mcp", where, "mcp_sdk"
    )
    assert isinstance(getattr(manager, "_server_instances", None), dict), moved(
        "mcp", where, "mcp_sdk"
    )
    discard = getattr(manager, "_discard_session", None)
    assert inspect.iscoroutinefunction(discard), moved("mcp", where, "mcp_sdk")
    assert list(inspect.signature(discard).parameters) == ["session_id", "transport"], moved(
        "mcp", where, "mcp_sdk"
    )

    class Ended:  # a transport already terminated: the discard only forgets it
        is_terminated = True

    transport = Ended()
    manager._session_owners.update(
        mine={"client_id": "app", "issuer": None, "subject": None},
        theirs={"client_id": "other", "issuer": None, "subject": None},
    )
    manager._server_instances.update(mine=transport, theirs=Ended())
    owned = mcp_sdk.sessions_owned_by(manager, "app")
    assert owned == [("mine", transport)], moved("mcp", where, "mcp_sdk")
    asyncio.run(mcp_sdk.discard_session(manager, "mine", transport))  # type: ignore[arg-type]
    assert mcp_sdk.sessions_owned_by(manager, "app") == [], moved("mcp", where, "mcp_sdk")
    assert "theirs" in manager._server_instances


def test_mcp_sdk_session_keeps_its_connection() -> None:
    """A ``ServerSession`` keeps the connection it was made for as ``_connection``."""
    from gateway.compat import mcp_sdk

    class Connection:
        protocol_version = "2025-06-18"

    connection = Connection()
    session = ServerSession(None, connection)  # type: ignore[arg-type]
    found = mcp_sdk.session_connection(session)
    assert found is connection, moved("mcp", "ServerSession._connection", "mcp_sdk")


def test_aiomqtt_client_internals_are_as_mended() -> None:
    """The client's loop, paho client, disconnect future, misc loop and pending dicts are there,
    and its pending-call check takes what ``FleetClient`` overrides it with."""
    from gateway.compat import aiomqtt as compat_aiomqtt

    async def check() -> None:
        client = aiomqtt.Client("127.0.0.1")
        for name, kind in [("_loop", asyncio.AbstractEventLoop), ("_disconnected", asyncio.Future)]:
            assert isinstance(getattr(client, name, None), kind), moved(
                "aiomqtt", f"Client.{name}", "aiomqtt"
            )
        paho = getattr(client, "_client", None)
        for hook in ("on_socket_open", "on_socket_register_write", "loop_read", "loop_write"):
            assert getattr(paho, hook, None) is not None, moved(
                "aiomqtt", f"Client._client.{hook} (paho)", "aiomqtt"
            )
        assert hasattr(client, "_misc_task"), moved("aiomqtt", "Client._misc_task", "aiomqtt")
        assert inspect.iscoroutinefunction(getattr(client, "_misc_loop", None)), moved(
            "aiomqtt", "Client._misc_loop", "aiomqtt"
        )
        for kind in ("subscribes", "unsubscribes", "publishes"):
            assert isinstance(getattr(client, f"_pending_{kind}", None), dict), moved(
                "aiomqtt", f"Client._pending_{kind}", "aiomqtt"
            )
        assert isinstance(getattr(client, "_logger", None), logging.Logger | logging.LoggerAdapter)
        assert isinstance(client.pending_calls_threshold, int)

    asyncio.run(check())
    theirs = inspect.signature(aiomqtt.Client._pending_call)
    ours = inspect.signature(compat_aiomqtt.FleetClient._pending_call)
    assert list(theirs.parameters) == list(ours.parameters), moved(
        "aiomqtt", "Client._pending_call(mid, value, pending_dict)", "aiomqtt"
    )


def subclasses(base: type) -> Iterator[type]:
    """The gateway's classes that derive from ``base``."""
    for sub in base.__subclasses__():
        if sub.__module__.startswith("gateway."):
            yield sub
        yield from subclasses(sub)


def test_uvicorn_methods_the_gateway_overrides_are_uvicorns() -> None:
    """Each method the gateway's subclasses replace is still one of uvicorn's, and
    ``OVERRIDDEN`` names every one they replace."""
    import gateway.device_side.transports.websocket  # noqa: F401 (uvicorn subclasses)
    import gateway.net.limits  # noqa: F401
    import gateway.net.listeners  # noqa: F401
    from gateway.compat import uvicorn as compat_uvicorn

    for base, declared in compat_uvicorn.OVERRIDDEN.items():
        gone = sorted(name for name in declared if not callable(getattr(base, name, None)))
        assert not gone, moved("uvicorn", f"{base.__qualname__}.{', '.join(gone)}", "uvicorn")
        found = set(subclasses(base))
        assert found, f"no class of gateway/ derives from {base.__qualname__}: drop it"
        replaced = {
            name
            for sub in found
            for name in vars(sub)
            if not name.startswith("__") and callable(getattr(base, name, None))
        }
        missing = sorted(replaced - declared)
        assert not missing, (
            f"add {missing} to OVERRIDDEN[{base.__name__}] (gateway/compat/uvicorn.py)"
        )


def test_uvicorn_protocols_set_what_the_subclasses_read() -> None:
    """The attributes the gateway's protocol subclasses read are set by uvicorn's ``__init__``."""
    from gateway.compat import uvicorn as compat_uvicorn

    async def app(scope: object, receive: object, send: object) -> None:
        raise NotImplementedError

    async def check() -> None:
        config = uvicorn.Config(app, ws="websockets-sansio", log_config=None)
        config.load()
        state = compat_uvicorn.ServerState()
        for name in ("connections", "tasks", "default_headers"):
            assert hasattr(state, name), moved("uvicorn", f"ServerState.{name}", "uvicorn")
        reads = {
            compat_uvicorn.H11Protocol: (
                "access_log",
                "app_state",
                "config",
                "connections",
                "limit_concurrency",
                "logger",
                "server_state",
                "ws_protocol_class",
            ),
            compat_uvicorn.WebSocketsSansIOProtocol: (
                "close_sent",
                "conn",
                "handshake_complete",
                "loop",
                "ping_interval",
                "ping_timeout",
                "queue",
                "read_paused",
                "writable",
            ),
        }
        for protocol, names in reads.items():
            made = protocol(config=config, server_state=state, app_state={})  # type: ignore[call-arg]
            missing = [name for name in names if not hasattr(made, name)]
            assert not missing, moved("uvicorn", f"{protocol.__qualname__}.{missing}", "uvicorn")

    asyncio.run(check())


def test_starlette_request_hands_on_a_replaced_form() -> None:
    """A form put in place of the parsed one is what the next ``request.form()`` returns."""
    from gateway.compat import starlette as compat_starlette

    body = [b"a=1"]

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": body.pop() if body else b"", "more_body": False}

    async def check() -> None:
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/",
            "headers": [(b"content-type", b"application/x-www-form-urlencoded")],
        }
        request = Request(scope, receive)
        first = await request.form()
        assert compat_starlette.parsed_form(request) is first, moved(
            "starlette", "Request._form", "starlette"
        )
        compat_starlette.replace_form(request, FormData([*first.multi_items(), ("b", "2")]))
        again = await request.form()
        assert list(again.multi_items()) == [("a", "1"), ("b", "2")], moved(
            "starlette", "Request._form", "starlette"
        )

    asyncio.run(check())


def test_argparse_lists_actions_and_subcommands() -> None:
    """argparse's action list holds the options and the subcommands' parsers."""
    from gateway.compat import stdlib

    parser = argparse.ArgumentParser()
    parser.add_argument("--token")
    sub = parser.add_subparsers().add_parser("run")
    sub.add_argument("--count")
    options = {option for action in stdlib.actions(parser) for option in action.option_strings}
    assert "--token" in options, moved("argparse", "ArgumentParser._actions", "stdlib")
    found = [p for action in stdlib.actions(parser) for p in stdlib.subcommand_parsers(action)]
    assert found == [sub], moved("argparse", "argparse._SubParsersAction", "stdlib")


def test_logging_caller_lookup_can_be_skipped() -> None:
    """``logging._srcfile`` is where logging looks to find a record's caller (the HOWTO's
    "Optimization"): None makes records carry no file or line."""
    from gateway.compat import stdlib

    kept = logging._srcfile  # None already if a test before set the gateway's logging up
    logger = logging.getLogger("tests.compat")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        logging._srcfile = logging.addLevelName.__code__.co_filename  # as logging sets it
        logger.warning("looked up")
        stdlib.skip_caller_lookup()
        logger.warning("skipped")
    finally:
        logging._srcfile = kept
        logger.removeHandler(handler)
    looked_up, skipped = records
    assert looked_up.lineno != 0 and skipped.lineno == 0, moved(
        "python", "logging._srcfile", "stdlib"
    )


# -- nothing outside gateway/compat reaches into another library --

# namedtuple's own API: public, underscored so as not to clash with its fields
_NAMEDTUPLE = {"_replace", "_asdict", "_fields", "_make"}
# Frames and code objects of generators, coroutines and functions: another library's state
_INTROSPECTION = re.compile(r"^(gi|cr|ag|f|tb|co)_[a-z]+$|^__(code|closure|globals)__$")
# Modules a library keeps for itself, named without an underscore
_INTERNAL_MODULES = (
    "uvicorn.protocols",
    "uvicorn.server",
    "websockets.streams",
    "websockets.speedups",
)
_ACCESSORS = {"getattr", "hasattr", "setattr", "delattr"}
_FRAME_GETTERS = {"_getframe", "currentframe"}  # sys's and inspect's


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def reaches_in(source: str) -> list[tuple[int, str]]:
    """Where ``source`` uses another library's private names or internals: (line, what)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "__future__" or node.module.split(".")[0] == "gateway":
                continue
            if any(_private(part) for part in node.module.split(".")):
                found.append((node.lineno, f"from {node.module}"))
            if node.module.startswith(_INTERNAL_MODULES):
                found.append((node.lineno, f"from {node.module}"))
            found += [
                (node.lineno, f"{node.module}.{a.name}") for a in node.names if _private(a.name)
            ]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if any(_private(p) for p in parts) or alias.name.startswith(_INTERNAL_MODULES):
                    found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.Attribute):
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if _private(node.attr) and not own and node.attr not in _NAMEDTUPLE:
                found.append((node.lineno, f"{ast.unparse(node.value)}.{node.attr}"))
            elif _INTROSPECTION.match(node.attr):
                found.append((node.lineno, f"{ast.unparse(node.value)}.{node.attr}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in _ACCESSORS and len(node.args) > 1:
                name = node.args[1]
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    if _private(name.value) or _INTROSPECTION.match(name.value):
                        found.append((node.lineno, f"{node.func.id}(..., {name.value!r})"))
    return found


def test_reaches_in_sees_every_form() -> None:
    """The check finds each way a module may reach into another library."""
    source = (
        "from websockets.http11 import _token_re\n"
        "from _typeshed import DataclassInstance\n"
        "from uvicorn.protocols.http.h11_impl import H11Protocol\n"
        "import asyncio\n"
        "loop = asyncio._get_running_loop()\n"
        "waiting = getattr(parser, 'gi_yieldfrom', None)\n"
        "code = StreamReader.at_eof.__code__\n"
        "owners = self.manager._session_owners\n"
        "ok = self._mine, parts._replace(path='/'), cls._too\n"
        "conn.parser.gi_yieldfrom\n"
    )
    lines = sorted({line for line, _ in reaches_in(source)})
    assert lines == [1, 2, 3, 5, 6, 7, 8, 10]


def test_no_module_outside_compat_reaches_into_another_library() -> None:
    """Every private name or internal of another library is used in gateway/compat only."""
    bad = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if COMPAT not in path.parents
        for line, what in reaches_in(path.read_text())
    ]
    assert not bad, f"move these into gateway/compat (a module per library): {bad}"


def test_no_module_reads_frames_or_code_objects() -> None:
    """No module of the gateway, gateway/compat included, tells another library's state by its
    generators', coroutines' or functions' frames and code objects: what a release may change
    without notice, and no test of ours could pin for every input."""
    bad = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, name in introspects(path.read_text())
    ]
    assert not bad, f"read another library's state through its API, not its frames: {bad}"


def introspects(source: str) -> list[tuple[int, str]]:
    """Where ``source`` reads a frame or a code object: (line, the attribute's name)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            if _INTROSPECTION.match(node.attr) or node.attr in _FRAME_GETTERS:
                found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in _ACCESSORS and len(node.args) > 1:
                name = node.args[1]
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    if _INTROSPECTION.match(name.value):
                        found.append((node.lineno, name.value))
        elif isinstance(node, ast.Name) and node.id in _FRAME_GETTERS:
            found.append((node.lineno, node.id))
    return found


def test_introspects_sees_every_form() -> None:
    """The check finds a frame or code object read as an attribute, by name, or fetched."""
    source = (
        "waiting = getattr(parser, 'gi_yieldfrom', None)\n"
        "code = StreamReader.at_eof.__code__\n"
        "frame = sys._getframe(1)\n"
        "ok = self.parser, conn.state\n"
        "from inspect import currentframe\n"
        "here = currentframe()\n"
    )
    assert sorted({line for line, _ in introspects(source)}) == [1, 2, 3, 6]


# The distribution each module of gateway/compat borrows from (stdlib: Python's own, unbounded).
COMPAT_DISTRIBUTIONS = {
    "aiomqtt": "aiomqtt",
    "mcp_sdk": "mcp",
    "starlette": "starlette",
    "uvicorn": "uvicorn",
}


def test_every_library_compat_borrows_from_is_bounded_above() -> None:
    """pyproject bounds each library gateway/compat reaches into, and the weekly workflow's
    ``scripts/newest-deps`` lifts those bounds."""
    modules = {path.stem for path in COMPAT.glob("*.py")} - {"__init__", "stdlib"}
    assert modules == set(COMPAT_DISTRIBUTIONS), "name the new module's distribution here"
    script = PACKAGE.parent / "scripts" / "newest-deps"
    done = subprocess.run(
        [sys.executable, str(script), "--list"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    unbounded = set(COMPAT_DISTRIBUTIONS.values()) - set(done.stdout.split())
    assert not unbounded, f"bound these above in pyproject.toml: {sorted(unbounded)}"
    workflow = (PACKAGE.parent / ".github" / "workflows" / "newest-deps.yml").read_text()
    assert "scripts/newest-deps" in workflow and "tests/test_compat.py" in workflow
