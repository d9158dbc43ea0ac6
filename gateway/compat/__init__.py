"""Every use the gateway makes of another library's private names, one module per library.

Elsewhere the gateway uses only public APIs; what no public API offers is borrowed here, as the
MCP SDK keeps its own in ``mcp/shared/_compat.py``. Each module is named for its library, and each
name it holds says the releases it was checked with and why nothing public does. The names are
bound when the module is imported, so a caller on a hot path pays nothing for the indirection.

``tests/test_compat.py`` checks each borrowed name against the installed release (a release that
moves one fails there first, naming the library and its version) and that no module outside this
package reaches into another library. pyproject bounds each of these libraries above;
``.github/workflows/newest-deps.yml`` runs the suite against their newest releases every week, so
a bound is lifted once that passes.

- ``mcp_sdk``: the streamable-HTTP manager's sessions and their owners; a session's connection.
- ``aiomqtt``: the paho socket's registration, the disconnect future, the pending-call check.
- ``uvicorn``: the protocol classes the listeners subclass, below uvicorn's public API.
- ``starlette``: the parsed form a request hands on to the next handler.
- ``stdlib``: argparse's actions, logging's caller lookup.
"""
