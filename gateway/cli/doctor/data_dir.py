"""The checks of the data dir: the gateway can write in it, and only its user can read it."""

from __future__ import annotations

import errno
import os

from gateway.cli.doctor.findings import Context


def check_data_dir(ctx: Context) -> None:
    """The gateway can create and write its files in the data dir."""
    path = ctx.config.data_dir
    why = ctx.probes.writable(path)
    if why is None:
        ctx.add("ok", "data dir", f"the gateway can write in {path}")
        return
    uid, gid = os.getuid(), os.getgid()
    if os.strerror(errno.EROFS) in why:  # no owner or mode helps on a read-only mount
        if ctx.container:
            fix = (
                f"{path} is mounted read-only: mount the volume read-write (no `:ro` on its "
                "`volumes:` line, no `read_only: true` covering it), then start the gateway again"
            )
        else:
            fix = (
                f"the file system holding {path} is read-only: remount it read-write, or set "
                "GATEWAY_DATA_DIR to a directory on a writable disk"
            )
    elif ctx.container:
        fix = (
            f"the volume must belong to uid {uid}: docker compose run --rm --user root "
            f"--entrypoint chown gateway -R {uid}:{gid} {path}"
        )
    else:
        fix = f"sudo chown -R {uid}:{gid} {path}, or set GATEWAY_DATA_DIR to a directory you own"
    ctx.add("problem", "data dir", f"the gateway cannot use {path}: {why}", fix)


def check_data_dir_private(ctx: Context) -> None:
    """No other user can read or write the data dir and the gateway's files in it."""
    path = ctx.config.data_dir
    exposed = ctx.probes.exposed(path)
    if not exposed:
        ctx.add("ok", "data dir privacy", f"only this user can read {path} (tokens, audit log)")
        return
    ctx.add(
        "warning",
        "data dir privacy",
        f"other users can read or write {', '.join(exposed)}: tokens and the audit log are there",
        f"chmod 700 {path} && chmod 600 {path}/* (the gateway does it at start when they "
        "belong to its user)",
    )
