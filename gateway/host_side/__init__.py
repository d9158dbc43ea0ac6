"""The host side: what MCP hosts and people see (MCP server, listings, HTTP app, dashboard).

Imports the core (devices) and net; never the device side.
"""
