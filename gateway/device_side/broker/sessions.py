"""A CONNECT is authenticated before it may touch anyone else's session.

amqtt 0.12 reads a CONNECT, then deletes any session with the same client id (clean session)
and takes over a connected one, and only *then* asks the auth plugins: a login with a device's
id and a wrong password silently cut the real device off (its session gone, its subscription to
its own ``down`` topic with it). ``AuthenticateFirst`` asks the plugins right after the CONNECT
is read and closes a refused client there, so a bound device stays connected and keeps
receiving its calls. This replaces ``Broker._initialize_client_session`` of amqtt 0.12 (pinned
in pyproject.toml), keeping its session handling for authenticated clients as it was.
"""

from __future__ import annotations

import logging
from typing import Any

from amqtt.errors import AMQTTError
from amqtt.mqtt.protocol.broker_handler import BrokerProtocolHandler
from amqtt.utils import gen_client_id

__all__ = ["AuthenticateFirst"]

logger = logging.getLogger(__name__)


class AuthenticateFirst:
    """Mixin for amqtt's ``Broker``: refuse a CONNECT before session take-over."""

    async def _initialize_client_session(
        self, reader: Any, writer: Any, remote_address: str, remote_port: int
    ) -> tuple[Any, Any]:
        broker: Any = self
        handler, session = await BrokerProtocolHandler.init_from_connect(
            reader, writer, broker.plugins_manager
        )
        listener = next(iter(broker.listeners_config.values()))
        if not await broker._authenticate(session, listener):
            handler.attach(session, reader, writer)
            await handler.mqtt_connack_authorize(False)
            await writer.close()
            raise AMQTTError(f"refused CONNECT for client id {session.client_id!r}")
        # From here on, amqtt 0.12's own handling of the (now authenticated) client's session.
        if session.clean_session:
            if session.client_id:
                await broker._delete_session(session.client_id)
            else:
                session.client_id = gen_client_id()
            session.parent = 0
        elif session.client_id in broker._sessions:
            existing, _ = broker._sessions[session.client_id]
            for field in ("will_flag", "will_message", "will_topic", "will_qos", "keep_alive",
                          "username", "password"):  # fmt: skip
                setattr(existing, field, getattr(session, field))
            session = existing
            session.parent = 1
        else:
            session.parent = 0
        delay = broker.config.get("timeout-disconnect-delay", 0)
        if session.keep_alive > 0 and isinstance(delay, int):
            session.keep_alive += delay
        return handler, session
