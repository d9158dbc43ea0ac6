"""Which devices an app may use, as the owner chooses it: on the consent page and in Connected apps.

The consent page has no script (its CSP), so the choice is a plain form: "all devices" (present
and future) or "only these", with a box to tick per device and a field of name globs
(``kitchen*``). Connected apps edits the same list as text. Either way the choice becomes the
grant's ``devices`` (``store.py``): a tuple of device ids and globs, or None for all.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

from starlette.datastructures import FormData

from gateway.host_side.device_scope import Named

__all__ = ["MAX_PATTERNS", "Fleet", "chosen_devices", "device_choice", "patterns"]

Fleet = Callable[[], Sequence[Named]]
MAX_PATTERNS = 200  # devices and globs one app's choice may hold
_MAX_PATTERN = 200  # characters of one
_SHOWN = 200  # devices listed to tick; past them, globs choose (a large fleet)
_NOTHING = "Choose at least one device (or a name pattern), or All devices."


def patterns(given: Sequence[object]) -> tuple[str, ...]:
    """Device ids and name globs, each checked; duplicates dropped, order kept.

    Raises:
        ValueError: none, too many, or one that is not a short string (the message says which).
    """
    found: dict[str, None] = {}
    for item in given:
        if not isinstance(item, str):
            raise ValueError("each device must be a device id or a name pattern (a string)")
        text = item.strip()
        if len(text) > _MAX_PATTERN:
            raise ValueError(f"a device pattern has more than {_MAX_PATTERN} characters")
        if text:
            found[text] = None
    if not found:
        raise ValueError(_NOTHING)
    if len(found) > MAX_PATTERNS:
        raise ValueError(f"more than {MAX_PATTERNS} devices and patterns: use name patterns")
    return tuple(found)


def chosen_devices(form: FormData) -> tuple[str, ...] | None:
    """The consent form's choice: None for all devices, else the ticked ids and the globs.
    A device ticked or a pattern typed limits the app even if "All devices" stayed selected:
    of the two readings, the narrower is the one the owner can widen later without harm.

    Raises:
        ValueError: "only these" with nothing chosen, or too much.
    """
    ticked = [str(value) for value in form.getlist("device")]
    globs = str(form.get("device_globs") or "").replace(",", " ").split()
    if form.get("devices") != "some" and not ticked and not globs:
        return None
    return patterns([*ticked, *globs])


def device_choice(fleet: Sequence[Named]) -> str:
    """The consent form's part that chooses the devices (HTML)."""
    boxes = "".join(
        f'<li><label><input type="checkbox" name="device" value="{html.escape(d.device_id)}">'
        f" {html.escape(d.alias)} <code>{html.escape(d.device_id)}</code></label></li>"
        for d in fleet[:_SHOWN]
    )
    more = (
        f'<p class="hint">{len(fleet) - _SHOWN} more devices are not listed: choose them by '
        "name pattern.</p>"
        if len(fleet) > _SHOWN
        else ""
    )
    listed = f'<ul id="device-list">{boxes}</ul>{more}' if boxes else "<p>No devices yet.</p>"
    return f"""<fieldset id="devices"><legend>Which devices it may use</legend>
  <label><input type="radio" name="devices" value="all" id="devices-all" checked>
  All devices, including those you add later</label>
  <label><input type="radio" name="devices" value="some" id="devices-some">
  Only the devices chosen here; it will not see or use any other</label>
  {listed}
  <label>and devices whose name or id matches <input name="device_globs" id="device-globs"
  placeholder="kitchen*, porch-*" autocomplete="off"></label>
  <p class="hint">A * stands for any characters: kitchen* is every device whose name starts
  with "kitchen", now or later. A device ticked or a pattern typed limits the app to
  those.</p>
</fieldset>"""
