"""The check of the config file: settings it makes that the environment or a flag outvotes."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from gateway.cli.doctor.findings import Context
from gateway.config import Config, env_name, file_key_of, load_config

_SECRETS = frozenset({"host_token", "device_tokens", "mqtt_password", "cluster_password"})


def file_only_config(path: str | None, env: Mapping[str, str] | None = None) -> Config | None:
    """The settings of the config file alone (``path``, else ``GATEWAY_CONFIG``), None without one.

    Raises:
        ConfigError: as ``load_config`` does.
    """
    path = path or (os.environ if env is None else env).get("GATEWAY_CONFIG")
    return load_config(Path(path), env={}) if path else None


def check_overridden(ctx: Context, file_only: Config, env: Mapping[str, str]) -> None:
    """Settings the file changes and the environment (or a flag) then overrides again.

    The Docker image sets the listeners and the data dir by environment, so a mounted file that
    sets them too is silently outvoted: the classic "I changed it and nothing happened".
    """
    defaults = load_config(None, env={})
    for item in dataclasses.fields(Config):
        name = item.name
        if name in ("device_tokens", "devices"):
            continue  # GATEWAY_DEVICE_TOKEN adds to the file's tokens; devices are file-only
        in_file, now = getattr(file_only, name), getattr(ctx.config, name)
        if in_file == now or in_file == getattr(defaults, name):
            continue
        key = file_key_of(name)  # calls.timeout, not call_timeout
        table, _, leaf = key.rpartition(".")
        variable = env_name(table, leaf)
        if variable in env:
            who, fix = variable, f"change {variable} (it wins over the file), or unset it"
        else:
            who, fix = "the environment or a flag", "change it where it is overridden"
        value = "" if name in _SECRETS else f" = {in_file}"
        wins = "" if name in _SECRETS else f" with {now}"
        ctx.add(
            "warning",
            "config file",
            f"the file sets {key}{value}, but {who} overrides it{wins}",
            fix,
        )
