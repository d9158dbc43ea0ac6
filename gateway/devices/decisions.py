"""Each catalogue's tools as the policy decides them, worked out once per catalogue.

``ToolDecisions`` is the catalogue service the known devices ask when a device gets a
catalogue: most of a fleet runs a firmware the config says nothing of, so their tools are
decided once for every such device; a device the config names is decided apart (its own
allow/deny, user tools and limits).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from gateway.config import Config, DeviceOptions
from gateway.devices.catalogue import Catalogue, ToolSpec
from gateway.devices.device import Decisions, Verdict, verdict
from gateway.devices.limits import limited

__all__ = ["ToolDecisions"]


class ToolDecisions:
    """The policy's verdicts on catalogues' tools, kept per shared catalogue."""

    def __init__(self, config: Config) -> None:
        self._config = config
        # Each shared catalogue's tools as decided for the devices the config says nothing of
        # (most of a fleet): worked out once per catalogue, not once per device and tool.
        self._defaults: weakref.WeakKeyDictionary[Catalogue, Decisions] = (
            weakref.WeakKeyDictionary()
        )

    def decide(self, device_id: str, catalogue: Catalogue) -> Decisions:
        """The tools of ``catalogue`` as the policy decides them for device ``device_id``."""
        options = self._config.devices.get(device_id)
        decided = None if options is not None else self._defaults.get(catalogue)
        if decided is None:
            verdicts = self.verdicts(catalogue.tools, options or DeviceOptions())
            specs: Sequence[ToolSpec] = catalogue.tools
            if options is not None and options.limits:  # the owner's bounds, compiled once here
                specs, verdicts = limited(device_id, specs, verdicts, options.limits)
            decided = Decisions(specs, verdicts)
            if options is None:
                self._defaults[catalogue] = decided
        return decided

    def verdicts(self, specs: Sequence[ToolSpec], options: DeviceOptions) -> list[Verdict]:
        """What the policy says of each tool of ``specs`` for a device with ``options``."""
        return [verdict(spec, options) for spec in specs]
