"""The user's decisions about devices: admission, approval, identity binding, names, forgetting.

``DeviceAdmin`` is the service that changes the known devices (``known.KnownDevices``, handed
to it) as an operator (CLI, dashboard) or a device's first contact decides: whether a device
may connect (``admit``: pending, approved or rejected, and the Client-Id it is bound to), the
pairing window, renaming, naming an enrolled device, and forgetting.
Each change is saved through the store and told to whoever watches devices.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from gateway.config import OTA_TRANSPORTS
from gateway.devices.audit import Actor, AuditLog
from gateway.devices.device import APPROVED, PENDING, REJECTED, Device
from gateway.devices.known import KnownDevices
from gateway.devices.link import BOARD_TRANSPORT
from gateway.devices.logins import CONFLICT, REFUSED, LoginRecords
from gateway.devices.naming import clean_alias
from gateway.devices.store import DeviceRecord
from gateway.devices.token_joins import TokenJoins
from gateway.devices.tokens import SEALED, TOKEN_BINDING, same_identity
from gateway.errors import StorageUnavailable
from gateway.net.limits import ThrottledLog

__all__ = ["DeviceAdmin"]

logger = logging.getLogger(__name__)

UNKNOWN = "\0unknown"  # what an approved device seen with a token only holds against others


class DeviceAdmin:
    """The changes to the known devices that people and first contacts decide."""

    def __init__(self, known: KnownDevices) -> None:
        config = known.config
        self._known = known
        self._config, self._store, self._clock = config, known.store, known.clock
        self.pairing_until = 0.0  # until then (clock time), new devices are approved as they come
        self.token_joins = TokenJoins(config.token_joins_per_hour, config.token_joins_total)
        self.audit: AuditLog = known.audit
        self.logins = LoginRecords(self.audit, per_minute=config.audit_logins_per_minute)
        self.decisions = 0  # approvals and bindings so far; logins wait until they are on disk
        self._committed_decisions = 0
        self._committing: asyncio.Future[None] | None = None  # the commit of decisions running
        self.pending_refused = 0  # new devices refused because that many waited already
        self._full = ThrottledLog(logger)

    def admit(
        self,
        device_id: str,
        *,
        trusted: bool,
        client_id: str | None,
        transport: str,
        board: str | None = None,
        peer: str | None = None,
        shared: bool = False,
    ) -> str | None:
        """Decide whether ``device_id`` may check in or connect; None, or why it may not.

        ``trusted`` is True when it presented a device token (shared or its own): it is approved
        if it was new or pending. A device without one (a stock device through OTA) is *pending*
        until the user approves it, unless ``[devices] adoption = "auto"`` or a pairing window
        is open; at most ``[devices] max_pending`` wait at once (boards found over mDNS, the
        ``BOARD_TRANSPORT``, wait apart: the discovery caps them). Once approved, a device is
        bound to the identity it presented (``client_id``: a Client-Id, or over MQTT what its
        credential stands for): a later attempt with another one is refused, recorded as a
        conflict (the device's ``conflict``, the log, the audit log), never swapped in.
        ``peer`` is the address it came from, for the records. ``shared``: the token is the
        shared one, which approves at most ``[devices] token_joins_*`` new devices (past them
        they wait as pending, ``token_joins.py``).
        """
        device_id = device_id.lower()
        actor = Actor(transport, peer)
        if transport != "mqtt" and client_id is not None and client_id.startswith(TOKEN_BINDING):
            # Only admission makes these (an MQTT login's token): presented as a Client-Id, the
            # binding alone would get the device's OTA credential, and with it the device.
            why = f"a Client-Id may not start with {TOKEN_BINDING!r}"
            known = self._known.get(device_id) is not None
            self.logins.note(REFUSED, actor, device_id=device_id, known=known, reason=why)
            return why
        device = self._known.get(device_id)
        if device is None:
            return self._first_contact(device_id, trusted, shared, client_id, board, actor)
        record = device.record
        if record.state == REJECTED:
            why = f"device {device_id} was rejected"
            self.logins.note(REFUSED, actor, device_id=device_id, alias=device.alias, reason=why)
            return why
        # Unbound (pending, or approved before bindings existed), a device holds the Client-Id
        # it was seen with: an approval binds the device the user saw, not whoever checked in
        # with its id last. A token (the shared one is on every board) takes no waiting device
        # seen with another Client-Id.
        holds = record.binding
        if holds is None and (not trusted or record.state == PENDING):
            holds = record.client_id
            if holds is None and record.state == APPROVED:
                holds = UNKNOWN  # seen with a token only: only a token binds it
        if holds is not None and not same_identity(holds, client_id, self._known.binding_key):
            device.conflict = (f"{transport} attempt with {_shown(client_id)} refused: "
                               "the device is bound to another identity")  # fmt: skip
            logger.warning("refused %s login as %s from %s: it presented %s, and the device "
                           "is bound to another identity", transport, device.label, peer,
                           _shown(client_id))  # fmt: skip
            self.logins.note(CONFLICT, actor, device_id=device_id, alias=device.alias,
                             reason=device.conflict)  # fmt: skip
            return f"device {device_id} is bound to another identity"
        if holds is not None and holds.startswith(SEALED) and holds == record.binding:
            # Bound on another replica (cluster): the device itself is here; keep it in clear.
            record.binding = client_id
            self._known.save(record)
        if record.state == PENDING and (
            self._clock() < self.pairing_until
            or (trusted and self._token_may_approve(shared, device_id, actor))
        ):
            self.approve(device, client_id)
        elif record.binding is None and client_id is not None and record.state == APPROVED:
            # Approved before it ever logged in (enrolled, or known to an older version): the
            # first login binds it, like an approval would have.
            record.binding = client_id
            self.decisions += 1
            self._known.save(record)
        return None

    def _first_contact(
        self, device_id: str, trusted: bool, shared: bool, client_id: str | None,
        board: str | None, actor: Actor,
    ) -> str | None:  # fmt: skip
        adopt = self._config.adoption == "auto" or self._clock() < self.pairing_until
        adopt = adopt or (trusted and self._token_may_approve(shared, device_id, actor))
        if not adopt:
            self.expire_pending()
        board_found = actor.who == BOARD_TRANSPORT  # found over mDNS: its own cap, not ours
        if not adopt and not board_found and not self._room_to_wait(actor, device_id):
            return f"{self._config.max_pending} devices wait for approval already"
        token_only = client_id is not None and client_id.startswith(TOKEN_BINDING)
        # Its Client-Id, if it has one; the transport it logs in over (an OTA check-in only
        # asks for one), so that its connect has nothing new to write after its approval, and
        # a board is known as one when the data dir is read again (``KnownDevices.queue``).
        seen_as = None if token_only else client_id
        connects = actor.who if actor.who in (*OTA_TRANSPORTS, BOARD_TRANSPORT) else None
        device = self._known.device(
            device_id, board, state=PENDING, client_id=seen_as, transport=connects
        )
        self._known.queue(device.record)[device_id] = device
        if adopt:
            self.approve(device, client_id)
        else:
            logger.warning("device %s is waiting for approval: esp-mcp-gateway devices "
                           "approve %s", device.label,
                           device.alias if device.named else device_id)  # fmt: skip
        return None

    def _token_may_approve(self, shared: bool, device_id: str, actor: Actor) -> bool:
        """Whether a device's token approves it; past the shared token's caps it waits."""
        if not shared:
            return True
        capped = self.token_joins.take()
        if capped is not None:
            self._full.warning("token_joins", "new device %s from %s presented the shared device "
                               "token, and %s: it waits for approval (esp-mcp-gateway devices "
                               "approve %s)", device_id, actor.where, capped,
                               device_id)  # fmt: skip
        return capped is None

    def _room_to_wait(self, actor: Actor, device_id: str) -> bool:
        """Whether one more device may wait for approval; say so when it may not."""
        if len(self._known.waiting) < self._config.max_pending:
            return True
        self.pending_refused += 1
        self._known.publish()  # the dashboard shows the count
        self._full.warning("pending", "refused new device %s from %s: %d devices wait for "
                           "approval already ([devices] max_pending); approve, reject or forget "
                           "some", device_id, actor.where, self._config.max_pending)  # fmt: skip
        self.logins.note(REFUSED, actor, device_id=device_id, known=False,
                         reason="the list of devices waiting for approval is full")  # fmt: skip
        return False

    def expire_pending(self) -> int:
        """Drop the pending devices unseen for ``[devices] pending_expiry``; return how many."""
        cutoff = self._clock() - self._config.pending_expiry
        queues = (self._known.waiting, self._known.waiting_boards)
        stale = [d for queue in queues for d in queue.values()
                 if d.record.last_seen < cutoff and not d.online]  # fmt: skip
        for device in stale:
            logger.info("device %s waited for approval %s, unseen: dropped", device.label,
                        _days(self._config.pending_expiry))  # fmt: skip
            self.forget(device)
        return len(stale)

    def approve(self, device: Device, presented: str | None = None) -> None:
        """Let ``device`` serve tools; bind its id to the identity it presented.

        ``presented``: what the login that approves it presented; else the Client-Id it was
        last seen with (the user approves the device they saw).
        """
        record = device.record
        if record.state == APPROVED and record.binding is not None:
            return  # approved again: nothing changes, nothing to say
        record.state = APPROVED
        record.binding = record.binding or presented or record.client_id
        self._known.unwait(device.device_id)
        self.decisions += 1
        self._known.save(record)
        logger.info("device %s approved", device.label)
        self._known.show(device)

    def reject(self, device: Device) -> None:
        """Refuse ``device`` from now on; its tools go (the caller closes its session)."""
        device.record.state = REJECTED
        self._known.unwait(device.device_id)
        self._known.save(device.record)
        logger.info("device %s (%s) rejected", device.alias, device.device_id)
        self._known.hide(device)

    async def commit_decisions(self) -> None:
        """Return once what logins decided so far (approvals by token or pairing, first
        bindings) is on disk; a login awaits it before it is accepted.

        One commit at a time, for every login waiting (a group commit): a storm of joins costs
        a transaction per commit's length, not one per device, and each login waits for at
        most two. When the data dir cannot be written the device is let in all the same (the
        store says so, and keeps trying): the decision holds in memory.
        """
        target = self.decisions
        while self._committed_decisions < target:
            if self._committing is not None:
                await asyncio.shield(self._committing)  # then look again: it may cover ours
                continue
            self._committing = asyncio.get_running_loop().create_future()
            covers = self.decisions  # the commit takes all queued from here on
            try:
                with contextlib.suppress(StorageUnavailable):
                    await self._store.commit()
            finally:
                self._committed_decisions = max(self._committed_decisions, covers)
                self._committing.set_result(None)
                self._committing = None

    async def settle(
        self, action: str, device: Device | None, actor: Actor, detail: str | None = None
    ) -> None:
        """Commit the change the user just made, then audit it: call before saying it is done.

        Raises:
            StorageUnavailable: it could not be written (it is retried; the record says so).
        """
        outcome, message = "ok", detail
        try:
            await self._store.commit()
        except StorageUnavailable as exc:
            outcome, message = "not saved", str(exc)
            raise
        finally:
            self.audit.event("admin", action, actor,
                             device_id=device.device_id if device else None,
                             alias=device.alias if device else None, outcome=outcome,
                             message=message)  # fmt: skip

    def pair(self, seconds: float) -> float:
        """Approve new devices as they arrive for ``seconds``; return when that ends."""
        self.pairing_until = self._clock() + seconds
        logger.info("pairing for %g s: new devices are approved as they arrive", seconds)
        return self.pairing_until

    def forget(self, device: Device) -> None:
        """Remove ``device`` and its names for good; if it comes back, it is a new device.

        A connected device stays connected until its session is closed (the caller's business);
        its session no longer counts for anything.
        """
        if not self._known.remove(device):
            return
        logger.info("device %s (%s) forgotten", device.alias, device.device_id)

    def rename(self, device: Device, name: str) -> str:
        """Give ``device`` a new alias, and its tools new MCP names; return the alias.

        Hosts are told the tool list changed. A device named in the config keeps that name.

        Raises:
            ValueError: the config names the device, or another device has the alias.
        """
        if self._config.device(device.device_id).name:
            raise ValueError(f"the config names device {device.alias}: rename it there")
        alias = clean_alias(name)
        holder = self._known.holder(alias)
        if holder is not None and holder is not device:
            raise ValueError(f"another device ({holder.device_id}) is called {alias}")
        if alias == device.alias:
            return alias
        logger.info("device %s (%s) renamed %s", device.alias, device.device_id, alias)
        self._known.set_alias(device, alias)
        self._known.save(device.record)
        self._known.use(device, device.catalogue)  # new names, saved; hosts told if they see them
        return alias

    def learn(self, record: DeviceRecord) -> Device:
        """cluster: take the fleet's facts on a device (state, alias, binding, board, firmware).

        What another replica decided arrives here from the broker; the device is made if it
        is new. Its tools are decided again when its alias changed, and shown or hidden by
        its state.
        """
        device = self._known.device(record.device_id, record.board, record.alias)
        mine = device.record
        mine.board = record.board or mine.board
        mine.transport = record.transport or mine.transport
        mine.server_info = record.server_info or mine.server_info  # its firmware version
        mine.state, mine.binding = record.state, record.binding
        mine.client_id = record.client_id or mine.client_id
        if record.alias != mine.alias and not self._config.device(record.device_id).name:
            self._known.set_alias(device, record.alias)
            self._known.use(device, device.catalogue)
        self._known.save(mine)
        self._known.show(device)
        return device

    def adopt(self, device_id: str, name: str) -> None:
        """Name a device that was enrolled as ``name`` (unless the config or a past run did)."""
        device_id = device_id.lower()
        if self._known.get(device_id) is not None or self._config.device(device_id).name:
            return
        alias = clean_alias(name)
        self._known.device(device_id, None, alias if self._known.holder(alias) is None else None)


def _shown(identity: str | None) -> str:
    """An identity as the log shows it: a Client-Id, or which kind of credential it was."""
    if identity is None:
        return "no Client-Id"
    if identity.startswith(TOKEN_BINDING):
        return "a device token (no Client-Id)"
    return f"Client-Id {identity!r}"


def _days(seconds: float) -> str:
    return f"{seconds / 86400:g} days" if seconds >= 86400 else f"{seconds:g} s"
