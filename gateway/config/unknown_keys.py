"""Unknown keys: each is refused with the closest known one (a typo, most likely) and the rest."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from gateway.config.keys import FIELDS, FORMER_KEYS
from gateway.errors import ConfigError

# Keys of a table that hold tables of their own, with their own parser: [[host.tokens]].
NESTED = {"host": {"tokens"}}


def unknown_key(
    key: str, known: set[str], tables: set[str] | frozenset[str] = frozenset()
) -> ConfigError:
    """An unknown key, with the closest known one (a typo, most likely) and all of them."""
    name = key.rpartition(".")[2]
    close = difflib.get_close_matches(name, sorted(known | tables), n=1, cutoff=0.6)
    hint = ""
    if close:
        hint = (
            f"did you mean [{close[0]}]? " if close[0] in tables else f"did you mean {close[0]!r}? "
        )
    listed = sorted(known) + [f"[{t}]" for t in sorted(tables)]
    return ConfigError(key, f"unknown key; {hint}known: {', '.join(listed)}")


def check_unknown_keys(data: Mapping[str, Any]) -> None:
    """Refuse a key or table of the file that no setting has (``[devices]`` holds device ids)."""
    # A former name is read (loading notes it), never offered as the closest known key.
    top = {k for t, k, _, _ in FIELDS if not t}
    tables = {t for t, _, _, _ in FIELDS if t}
    for key, value in data.items():
        known = {k for t, k, _, _ in FIELDS if t == key}
        if key in top or ("", key) in FORMER_KEYS or key == "mcp_devices":  # boards: own parser
            continue
        if not known:
            raise unknown_key(key, top, tables | {"devices", "mcp_devices"})
        if not isinstance(value, dict):
            raise ConfigError(key, "expected a table")
        if key == "devices":
            continue  # every other key of [devices] is a device id
        known |= NESTED.get(key, set())
        for name in sorted(set(value) - known - {k for t, k in FORMER_KEYS if t == key}):
            raise unknown_key(f"{key}.{name}", known)
