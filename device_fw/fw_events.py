"""Events: the board speaks up, as MCP logging notifications (docs/events.md).

    events = Events(device.notify)
    events.press("boot")                          # a button
    events.threshold("sensor.temperature", 41.2, 40, hysteresis=1, unit="C")
    events.reading("sensor.light", 512, delta=20)  # a reading, when it changed enough

Each event goes as ``{"jsonrpc":"2.0","method":"notifications/message","params":{"level",
"logger","data"}}`` in the usual mcp envelope. A board sends at most ``burst`` events at once
and ``rate`` a second after that; past it an event is dropped and counted (``dropped``). A
reading is remembered only once sent, so the next reading after a drop still goes when it
differs from the one the gateway has. Needs only fw_compat.py.
"""

import fw_compat as compat

MESSAGE = "notifications/message"
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


class Events:
    """Emits events through ``send`` (fw_device.Device.notify: sends while connected).

    ``clock`` is a millisecond clock (ticks_ms; tests pass their own).
    """

    def __init__(self, send, rate=2.0, burst=5, clock=None):
        self.send = send
        self.rate = rate
        self.burst = burst
        self.clock = clock or compat.ticks_ms
        self.tokens = float(burst)
        self.dropped = 0
        self._at = self.clock()
        self._readings = {}  # logger -> the last value sent
        self._above = {}  # logger -> whether the value was last past its threshold

    def emit(self, logger, data, level="info"):
        """Send one event; return False when the rate dropped it."""
        if level not in LEVELS:
            raise ValueError("level must be one of " + ", ".join(LEVELS))
        if not self._take():
            self.dropped += 1
            compat.log(compat.DEBUG, "event dropped (rate): %s", logger)
            return False
        params = {"level": level, "logger": logger, "data": data}
        self.send({"jsonrpc": "2.0", "method": MESSAGE, "params": params})
        return True

    def press(self, button):
        """A button was pressed: logger ``button.<name>``."""
        return self.emit("button." + button, {"event": "press"})

    def reading(self, logger, value, delta=0, unit=None):
        """A reading, sent when it differs by more than ``delta`` from the last one sent."""
        last = self._readings.get(logger)
        if last is not None and abs(value - last) <= delta:
            return False
        data = {"value": value}
        if unit is not None:
            data["unit"] = unit
        sent = self.emit(logger, data)
        if sent:
            self._readings[logger] = value
        return sent

    def threshold(self, logger, value, limit, hysteresis=0, unit=None):
        """Send when ``value`` crosses above ``limit`` (level warning), and again when it falls
        back below ``limit - hysteresis`` (level info); nothing in between."""
        above = self._above.get(logger, False)
        now = value > limit if not above else value >= limit - hysteresis
        if now == above:
            return False
        data = {"value": value, "limit": limit, "state": "above" if now else "below"}
        if unit is not None:
            data["unit"] = unit
        sent = self.emit(logger, data, "warning" if now else "info")
        if sent:
            self._above[logger] = now
        return sent

    def _take(self):
        now = self.clock()
        elapsed = compat.ticks_diff(now, self._at) / 1000
        self._at = now
        self.tokens = min(float(self.burst), self.tokens + elapsed * self.rate)
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True
