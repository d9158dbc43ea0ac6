"""Starlette's private names: the parsed form a request keeps.

Checked with Starlette 1.10.0 (pyproject: ``starlette>=1.0,<2``).
"""

from __future__ import annotations

from starlette.datastructures import FormData
from starlette.requests import Request

__all__ = ["parsed_form", "replace_form"]


def parsed_form(request: Request) -> FormData | None:
    """The form ``await request.form()`` parsed already, or None (``Request._form``)."""
    return request._form


def replace_form(request: Request, form: FormData) -> None:
    """Make ``form`` what the next ``await request.form()`` returns (``Request._form``).

    The MCP SDK's OAuth handlers read the form again from the request they are handed: the only
    way to add a field for them (a public client's empty ``client_secret``, a stand-in PKCE
    verifier) without parsing the body a second time. Starlette keeps the parsed form in
    ``_form`` and returns it while set (1.0 to 1.10).
    """
    request._form = form
