"""The OAuth server's durable state: registered apps, grants, codes and tokens (``oauth.sqlite3``).

A grant is one consent the owner gave one app; its codes and tokens hang from it, and revoking
the grant ends them all. It holds the devices the owner let the app use (a JSON list of device
ids and name globs, NULL for all), which the owner may change later: each token the app presents
reads it anew. Codes and tokens are kept as SHA-256 digests only: a copy of the data
dir hands out no working token. Every change is committed before the caller answers (the SQLite
file is opened in autocommit mode), so a token the app was given survives a crash, and one the
owner revoked stays revoked.

A refresh must also be answerable twice: two requests racing with one refresh token, or the
retry of an app whose answer was lost when the gateway died right after committing the refresh,
must get the same new pair, which the store cannot read back from digests. So the pair is derived
from the spent refresh token and a random nonce kept beside its digest (``successors``): the
nonce alone derives nothing, and it is forgotten when the grace period ends (``REFRESH_GRACE``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.devices.store import open_database
from gateway.errors import StorageUnavailable

__all__ = [
    "NEW_CLIENT_AGE",
    "REFRESH_GRACE",
    "UNALLOWED_PER_ADDRESS",
    "Credential",
    "Grant",
    "OAuthStore",
    "Rotation",
    "StoredToken",
    "digest",
    "new_secret",
]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS clients (
    client_id  TEXT PRIMARY KEY,
    info       TEXT NOT NULL,
    address    TEXT,
    created    REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS grants (
    id          TEXT PRIMARY KEY,
    client_id   TEXT NOT NULL,
    client_name TEXT NOT NULL,
    scopes      TEXT NOT NULL,
    resource    TEXT NOT NULL,
    redirect    TEXT NOT NULL,
    granted_at  REAL NOT NULL,
    last_used   REAL,
    revoked_at  REAL,
    devices     TEXT
);
CREATE INDEX IF NOT EXISTS grants_by_client ON grants (client_id);
CREATE TABLE IF NOT EXISTS tokens (
    digest   TEXT PRIMARY KEY,
    kind     TEXT NOT NULL,
    grant_id TEXT NOT NULL,
    expires  REAL NOT NULL,
    used     INTEGER NOT NULL DEFAULT 0,
    extra    TEXT
);
CREATE INDEX IF NOT EXISTS tokens_by_grant ON tokens (grant_id);
CREATE TABLE IF NOT EXISTS credentials (
    client_id  TEXT PRIMARY KEY,
    info       TEXT NOT NULL,
    secret     TEXT NOT NULL,
    no_pkce    INTEGER NOT NULL,
    created    REAL NOT NULL
);
"""

CODE, ACCESS, REFRESH = "code", "access", "refresh"
_LAST_USE_EVERY = 60.0  # seconds: "last use" is written at most this often per grant
# Seconds a spent refresh token still gets the pair it was spent for (a race, or the retry after
# a lost answer); presented later, it is a replay. Also how long the access token a refresh
# replaced keeps working (at most its own expiry), for the requests in flight with it.
REFRESH_GRACE = 60.0
# Apps that registered themselves but hold no live grant are forgotten (``prune_clients``): never
# allowed, after this many seconds (longer than a consent request waits, consent_requests.py)...
NEW_CLIENT_AGE = 900.0
REVOKED_CLIENT_AGE = 3600.0  # ... revoked, after an hour (an app may sign in again meanwhile)
UNALLOWED_PER_ADDRESS = 10  # ... and beyond this many from one address, the oldest of them
_UNALLOWED = "client_id NOT IN (SELECT client_id FROM grants WHERE revoked_at IS NULL)"


def digest(secret: str) -> str:
    """What is stored of a code or token: its SHA-256, in hex."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def new_secret(prefix: str) -> str:
    """A fresh code or token: 256 random bits, with a prefix that says what it is."""
    return prefix + secrets.token_urlsafe(32)


def successors(spent: str, nonce: str) -> tuple[str, str]:
    """The access and refresh token a refresh with ``spent`` issues, given its ``nonce``."""

    def derive(label: str) -> str:
        mac = hmac.new(
            spent.encode("utf-8", "surrogatepass"), f"{nonce}:{label}".encode(), "sha256"
        )
        return base64.urlsafe_b64encode(mac.digest()).decode().rstrip("=")

    return "gwa_" + derive(ACCESS), "gwr_" + derive(REFRESH)


@dataclass(frozen=True, slots=True)
class Grant:
    """One consent: ``client_id`` may use ``scopes`` on ``resource`` until revoked."""

    id: str
    client_id: str
    client_name: str
    scopes: tuple[str, ...]
    resource: str
    redirect: str
    granted_at: float
    last_used: float | None
    revoked_at: float | None
    devices: tuple[str, ...] | None = None  # device ids and name globs; None: every device


@dataclass(frozen=True, slots=True)
class Rotation:
    """What a refresh issued: the new pair, and when the access token expires."""

    access: str
    refresh: str
    access_expires: float


@dataclass(frozen=True, slots=True)
class StoredToken:
    """A code or token found by its digest, with the grant it belongs to."""

    kind: str
    grant: Grant
    expires: float
    used: bool
    extra: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Credential:
    """App credentials the owner made: client metadata, the secret's digest, the PKCE rule."""

    client_id: str
    info: dict[str, Any]
    secret: str  # SHA-256 of the client secret, in hex (the secret itself was shown once)
    no_pkce: bool  # the owner marked the app as one that cannot send PKCE
    created: float


class OAuthStore:
    """The SQLite file, and the few queries the provider and the dashboard need."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self._db = open_database(path, _SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(grants)")}
        if "devices" not in columns:  # a file from before grants named devices: all, as then
            self._db.execute("ALTER TABLE grants ADD COLUMN devices TEXT")
        self._lock = threading.Lock()
        self.clock = clock  # the time of every expiry and grace period (a test moves it)
        self._last_use_written: dict[str, float] = {}

    def close(self) -> None:
        """Close the file."""
        self._db.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction, committed on exit (or rolled back); a failure says so clearly."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StorageUnavailable(f"cannot save OAuth state: {exc}") from exc

    # --- apps ---------------------------------------------------------------------------------

    def save_client(self, client_id: str, info: dict[str, Any], address: str | None) -> None:
        """Remember a registered app."""
        with self._write() as db:
            db.execute(
                "INSERT OR REPLACE INTO clients VALUES (?, ?, ?, ?)",
                (client_id, json.dumps(info), address, self.clock()),
            )

    def client(self, client_id: str) -> dict[str, Any] | None:
        """A registered app's metadata, as it registered."""
        row = self._db.execute("SELECT info FROM clients WHERE client_id = ?", (client_id,))
        found = row.fetchone()
        return json.loads(found[0]) if found else None

    def prune_clients(self, address: str | None, cap: int) -> int:
        """Make room for an app registering from ``address``; returns how many apps stay.

        Apps without a live grant are forgotten: never allowed, ``NEW_CLIENT_AGE`` seconds after
        they registered; revoked, after ``REVOKED_CLIENT_AGE``; past ``UNALLOWED_PER_ADDRESS``
        of one address, its oldest; at ``cap`` apps, the oldest of all. An allowed app is never
        forgotten, so no flood of registrations can push it out, nor lock a new app out for
        longer than its own registration takes."""
        now = self.clock()
        with self._write() as db:
            db.execute(
                f"DELETE FROM clients WHERE {_UNALLOWED} AND created < ? AND client_id NOT IN "
                "(SELECT client_id FROM grants)",
                (now - NEW_CLIENT_AGE,),
            )
            db.execute(
                f"DELETE FROM clients WHERE {_UNALLOWED} AND created < ?",
                (now - REVOKED_CLIENT_AGE,),
            )
            db.execute(
                f"DELETE FROM clients WHERE client_id IN (SELECT client_id FROM clients WHERE "
                f"{_UNALLOWED} AND address IS ? ORDER BY created DESC LIMIT -1 OFFSET ?)",
                (address, UNALLOWED_PER_ADDRESS - 1),
            )
            kept = int(db.execute("SELECT COUNT(*) FROM clients").fetchone()[0])
            if kept < cap:
                return kept
            db.execute(
                f"DELETE FROM clients WHERE client_id IN (SELECT client_id FROM clients WHERE "
                f"{_UNALLOWED} ORDER BY created LIMIT ?)",
                (kept - cap + 1,),
            )
            return int(db.execute("SELECT COUNT(*) FROM clients").fetchone()[0])

    # --- app credentials (made by the owner; never pruned, never counted in the cap) -----------

    def save_credential(self, credential: Credential) -> None:
        """Remember app credentials the owner made."""
        with self._write() as db:
            db.execute(
                "INSERT INTO credentials VALUES (?, ?, ?, ?, ?)",
                (
                    credential.client_id,
                    json.dumps(credential.info),
                    credential.secret,
                    int(credential.no_pkce),
                    credential.created,
                ),
            )

    def credential(self, client_id: str) -> Credential | None:
        """The credentials ``client_id``, if the owner made them."""
        row = self._db.execute(
            "SELECT * FROM credentials WHERE client_id = ?", (client_id,)
        ).fetchone()
        return _credential(row) if row else None

    def credentials(self) -> list[Credential]:
        """Every app credential, newest first."""
        rows = self._db.execute("SELECT * FROM credentials ORDER BY created DESC").fetchall()
        return [_credential(row) for row in rows]

    def delete_credential(self, client_id: str) -> bool:
        """Forget app credentials; True when there were some."""
        with self._write() as db:
            gone = db.execute("DELETE FROM credentials WHERE client_id = ?", (client_id,))
            return gone.rowcount > 0

    # --- grants, codes and tokens --------------------------------------------------------------

    def add_grant(self, grant: Grant, code: str, expires: float, extra: dict[str, Any]) -> None:
        """Record the owner's consent and the code that redeems it, in one transaction."""
        with self._write() as db:
            db.execute(
                "INSERT INTO grants (id, client_id, client_name, scopes, resource, redirect, "
                "granted_at, devices) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    grant.id,
                    grant.client_id,
                    grant.client_name,
                    " ".join(grant.scopes),
                    grant.resource,
                    grant.redirect,
                    grant.granted_at,
                    _devices_column(grant.devices),
                ),
            )
            db.execute(
                "INSERT INTO tokens VALUES (?, ?, ?, ?, 0, ?)",
                (digest(code), CODE, grant.id, expires, json.dumps(extra)),
            )

    def find(self, secret: str) -> StoredToken | None:
        """The code or token ``secret``, used or not, with its grant."""
        row = self._db.execute(
            "SELECT kind, grant_id, expires, used, extra FROM tokens WHERE digest = ?",
            (digest(secret),),
        ).fetchone()
        if row is None:
            return None
        grant = self.grant(row[1])
        if grant is None:
            return None
        return StoredToken(row[0], grant, row[2], bool(row[3]), json.loads(row[4] or "{}"))

    def grant(self, grant_id: str) -> Grant | None:
        """The grant ``grant_id``, revoked or not."""
        row = self._db.execute("SELECT * FROM grants WHERE id = ?", (grant_id,)).fetchone()
        return _grant(row) if row else None

    def issue(self, grant_id: str, spent: str, tokens: dict[str, tuple[str, float]]) -> None:
        """Mark the code ``spent`` used and save new ``tokens`` (kind: secret, expiry), in one
        transaction: the code can never be redeemed twice."""
        with self._write() as db:
            db.execute("UPDATE tokens SET used = 1 WHERE digest = ?", (digest(spent),))
            for kind, (secret, expires) in tokens.items():
                db.execute(
                    "INSERT INTO tokens VALUES (?, ?, ?, ?, 0, NULL)",
                    (digest(secret), kind, grant_id, expires),
                )

    def rotate(
        self, grant_id: str, spent: str, access_life: float, refresh_life: float
    ) -> Rotation:
        """Spend the refresh token ``spent`` for a new pair, in one transaction; spent already
        (within the grace period, which the caller checked), the pair it was spent for. The
        access tokens it replaces keep working ``REFRESH_GRACE`` seconds at most."""
        now = self.clock()
        with self._write() as db:
            row = db.execute("SELECT extra FROM tokens WHERE digest = ?", (digest(spent),))
            found = row.fetchone()
            earlier = json.loads(found[0] or "{}") if found else {}
            if "successor" in earlier:
                access, refresh = successors(spent, earlier["successor"])
                expiry = db.execute(
                    "SELECT expires FROM tokens WHERE digest = ?", (digest(access),)
                ).fetchone()
                return Rotation(access, refresh, expiry[0] if expiry else now)
            nonce = secrets.token_urlsafe(16)
            access, refresh = successors(spent, nonce)
            db.execute(
                "UPDATE tokens SET used = 1, extra = ? WHERE digest = ?",
                (json.dumps({"successor": nonce, "spent_at": now}), digest(spent)),
            )
            db.execute(
                "UPDATE tokens SET expires = MIN(expires, ?) WHERE grant_id = ? AND kind = ?",
                (now + REFRESH_GRACE, grant_id, ACCESS),
            )
            for kind, secret, expires in (
                (ACCESS, access, now + access_life),
                (REFRESH, refresh, now + refresh_life),
            ):
                db.execute(
                    "INSERT INTO tokens VALUES (?, ?, ?, ?, 0, NULL)",
                    (digest(secret), kind, grant_id, expires),
                )
            self._forget_nonces(db, grant_id, now)
        return Rotation(access, refresh, now + access_life)

    def _forget_nonces(self, db: sqlite3.Connection, grant_id: str | None, now: float) -> None:
        """Past the grace period a spent refresh token's nonce is worth nothing but a risk."""
        db.execute(
            "UPDATE tokens SET extra = NULL WHERE kind = ? AND used = 1 AND extra IS NOT NULL "
            "AND json_extract(extra, '$.spent_at') < ? AND (? IS NULL OR grant_id = ?)",
            (REFRESH, now - REFRESH_GRACE, grant_id, grant_id),
        )

    def revoke_grant(self, grant_id: str) -> None:
        """End a grant: its codes and tokens stop working now."""
        with self._write() as db:
            db.execute(
                "UPDATE grants SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                (self.clock(), grant_id),
            )
            db.execute("DELETE FROM tokens WHERE grant_id = ?", (grant_id,))

    def set_devices(self, client_id: str, devices: tuple[str, ...] | None) -> int:
        """Let every live grant of an app use ``devices`` (None: all) from its next request;
        returns how many grants changed."""
        with self._write() as db:
            changed = db.execute(
                "UPDATE grants SET devices = ? WHERE client_id = ? AND revoked_at IS NULL",
                (_devices_column(devices), client_id),
            )
            return changed.rowcount

    def revoke_client(self, client_id: str) -> list[Grant]:
        """End every live grant of an app; returns those it ended."""
        ended = [grant for grant in self.grants(client_id) if grant.revoked_at is None]
        for grant in ended:
            self.revoke_grant(grant.id)
        return ended

    def grants(self, client_id: str | None = None) -> list[Grant]:
        """Grants, newest first (of one app, or all)."""
        query, args = "SELECT * FROM grants", ()
        if client_id is not None:
            query, args = query + " WHERE client_id = ?", (client_id,)  # type: ignore[assignment]
        rows = self._db.execute(query + " ORDER BY granted_at DESC", args).fetchall()
        return [_grant(row) for row in rows]

    def redeemed(self) -> set[str]:
        """The grants whose code an app redeemed: those holding an access or refresh token (a
        consent the app never came back for, or whose tokens all ended, is no connected app)."""
        rows = self._db.execute(
            "SELECT DISTINCT grant_id FROM tokens WHERE kind IN (?, ?)", (ACCESS, REFRESH)
        )
        return {row[0] for row in rows}

    def used(self, grant_id: str) -> None:
        """Note that a grant's token was just used (written at most once a minute)."""
        now = self.clock()
        if now - self._last_use_written.get(grant_id, 0.0) < _LAST_USE_EVERY:
            return
        self._last_use_written[grant_id] = now
        try:
            with self._write() as db:
                db.execute("UPDATE grants SET last_used = ? WHERE id = ?", (now, grant_id))
        except StorageUnavailable:
            pass  # "last use" is a courtesy: a full disk must not refuse the call itself

    def expire(self) -> None:
        """Drop codes and tokens past their expiry, and nonces past their grace period."""
        now = self.clock()
        with self._write() as db:
            db.execute("DELETE FROM tokens WHERE expires < ?", (now - 3600,))
            self._forget_nonces(db, None, now)


def _grant(row: tuple[Any, ...]) -> Grant:
    scopes = tuple(row[3].split()) if row[3] else ()
    devices = tuple(json.loads(row[9])) if row[9] is not None else None
    return Grant(row[0], row[1], row[2], scopes, row[4], row[5], row[6], row[7], row[8], devices)


def _devices_column(devices: tuple[str, ...] | None) -> str | None:
    return json.dumps(list(devices)) if devices is not None else None


def _credential(row: tuple[Any, ...]) -> Credential:
    return Credential(row[0], json.loads(row[1]), row[2], bool(row[3]), row[4])
