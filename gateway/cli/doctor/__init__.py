"""``esp-mcp-gateway doctor``: the configuration checked the way users' problems show up.

A device that never connects, an MCP host that gets "connection refused", a container that
restarts forever: each has a cause in the configuration (an advertised address devices cannot
reach, a listener on the wrong interface, a missing host token, a broker that does not answer, a
data dir the gateway cannot write). ``diagnose()`` returns one ``Finding`` per check, with the fix
in the user's terms. It does no I/O of its own: what it needs from the network and the disk comes
through ``Probes``, so the checks are unit-tested with fakes; ``Probes()`` holds the real ones, each
bounded by a short timeout and aimed only at addresses the configuration names.

The modules: ``probes`` (the machine: ports, the data dir, containers), ``findings`` (what a
check reports), then the checks of the configuration, in the order ``diagnose()`` runs them:
``listeners`` (device and host listeners, the device URL, ports), ``remote`` (the remote URL,
settings under former names), ``broker`` (MQTT),
``data_dir``, ``upstream`` (voice servers), ``config_file`` (file settings the environment
outvotes). ``commands.doctor``
prints the report.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gateway.cli.doctor.broker import check_broker, check_broker_endpoint
from gateway.cli.doctor.config_file import check_overridden, file_only_config
from gateway.cli.doctor.data_dir import check_data_dir, check_data_dir_private
from gateway.cli.doctor.findings import Context, Finding, Level
from gateway.cli.doctor.listeners import (
    check_device_listener,
    check_device_url,
    check_host_listener,
    check_ports,
    check_running,
)
from gateway.cli.doctor.probes import (
    Listener,
    Probes,
    exposed_probe,
    in_container,
    listener_probe,
    tcp_probe,
    writable_probe,
)
from gateway.cli.doctor.remote import check_remote_url, check_renamed
from gateway.cli.doctor.upstream import check_upstream, check_upstream_brokers
from gateway.config import Config

__all__ = [
    "Finding",
    "Level",
    "Listener",
    "Probes",
    "diagnose",
    "exposed_probe",
    "file_only_config",
    "in_container",
    "listener_probe",
    "tcp_probe",
    "writable_probe",
]


def diagnose(
    config: Config,
    *,
    container: bool = False,
    probes: Probes | None = None,
    file_only: Config | None = None,
    env: Mapping[str, str] | None = None,
) -> list[Finding]:
    """Check ``config`` and return every finding, problems and passes alike, in a stable order.

    Args:
        config: the effective configuration (file, environment, flags).
        container: the gateway runs in a container (``in_container()``): loopback is then
            unreachable from outside and the machine's own addresses mean nothing to devices.
        probes: the network and disk probes (``Probes()`` when None).
        file_only: the configuration from the config file alone, when there is one
            (``file_only_config()``), to report file settings that the environment overrides.
        env: the environment, to name the variable that overrides a setting.
    """
    ctx = Context(config, container, probes or Probes())
    check_device_listener(ctx)
    check_device_url(ctx)
    check_remote_url(ctx)
    check_renamed(ctx)
    check_host_listener(ctx)
    check_ports(ctx)
    running = check_running(ctx)
    check_broker(ctx, running)
    check_broker_endpoint(ctx)
    check_data_dir(ctx)
    check_data_dir_private(ctx)
    check_upstream(ctx)
    check_upstream_brokers(ctx)
    if file_only is not None:
        check_overridden(ctx, file_only, os.environ if env is None else env)
    return ctx.findings
