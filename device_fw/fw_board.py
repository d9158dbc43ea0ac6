"""The board layer: what tools may touch, behind one small interface.

Board holds what every board shares (configured pins, uptime, memory); SimBoard keeps the
hardware in RAM and stands in wherever machine/network are missing (the unix port, CPython);
fw_esp32.Esp32Board drives a real ESP32. make_board() picks one.
"""

import sys

import fw_compat as compat


class Board:
    """The interface tools use. Output names map to (pin, inverted); None means "absent"."""

    name = "esp32"
    chip = "esp32"
    camera = False  # whether capture() can take photos (then the board has self.camera.*)

    def __init__(self, config):
        pins = config["pins"]
        self.outputs = {}
        for name, spec in (pins.get("outputs") or {}).items():
            if isinstance(spec, dict):
                spec = (spec["pin"], bool(spec.get("invert")))
            else:
                spec = (spec, False)
            self.outputs[name] = spec
        self.adc_pin = pins.get("adc")
        self.pixel_pin = pins.get("neopixel")
        self.pixel_count = pins.get("neopixel_count") or 1
        self.buzzer_pin = pins.get("buzzer")
        self.display_pins = pins.get("display")  # {"sda": 21, "scl": 22}: an SSD1306 on I2C
        self.started = compat.seconds()
        self.on_reboot = None  # the runtime's hook: a simulated reboot drops the link
        self.shown = None  # the last alert shown: (status, message, emotion)
        self.events = None  # the runtime's fw_events.Events: what buttons and sensors emit by

    def uptime(self):
        """Whole seconds since boot."""
        return int(compat.seconds() - self.started)

    def memory(self):
        """(free, used) heap bytes, or (None, None) where the runtime has no fixed heap."""
        return compat.memory()

    async def start_network(self):
        """Bring the network up (Wi-Fi); raise OSError if it cannot."""

    def mac(self):
        """The station MAC as aa:bb:cc:dd:ee:ff, or None."""
        return None

    def rssi(self):
        """Wi-Fi signal in dBm, or None."""
        return None

    def temperature(self):
        """The chip's internal temperature in Celsius, or None if it has no sensor."""
        return None

    def set_output(self, name, on):
        raise NotImplementedError

    def get_output(self, name):
        raise NotImplementedError

    def read_adc(self):
        """(raw 0..65535, microvolts or None)."""
        raise NotImplementedError

    def set_pixel(self, rgb):
        raise NotImplementedError

    def capture(self):
        """A photo as JPEG bytes, or None if the camera failed."""
        return None

    def alert(self, status, message, emotion):
        """Show a message from the gateway (notify_device) and beep: on the console always,
        on a screen and a buzzer where the board has them (``show``, ``beep``)."""
        self.shown = (status, message, emotion)
        compat.log(compat.INFO, "alert [%s] %s (%s)", status, message, emotion)
        self.show(status, message, emotion)
        self.beep()

    def show(self, status, message, emotion):
        """Put the message on the board's screen; a board without one has only its console."""

    def beep(self):
        """Sound the buzzer once, if the board has one."""

    def reboot(self):
        raise NotImplementedError


# What the simulated camera sees, one photo after the other.
COLOURS = ((255, 128, 0), (0, 160, 255), (60, 200, 60), (230, 40, 120), (250, 230, 80))


class SimBoard(Board):
    """A board in RAM: outputs remember their level, the ADC and the temperature drift, and
    with config "camera": true the camera takes 160x120 photos of one colour, changing with
    every photo (its number is in the JPEG's comment)."""

    name = "sim-esp32"
    chip = "simulated"

    def __init__(self, config):
        super().__init__(config)
        if self.adc_pin is None:
            self.adc_pin = 34
        if self.pixel_pin is None:
            self.pixel_pin = 48
        self._mac = config.get("device_id") or None
        self._millivolts = 1650
        self._celsius = 41.0
        self.camera = bool(config.get("camera"))
        self.photos = 0
        self.beeps = 0
        self.reset()

    def reset(self):
        """Forget what a real board keeps only in RAM."""
        self.levels = dict.fromkeys(self.outputs, False)
        self.pixel = (0, 0, 0)
        self.started = compat.seconds()

    def mac(self):
        if self._mac is None:
            raw = bytearray(compat.urandom(6))
            raw[0] = 0x02  # locally administered: no real board ships with it
            self._mac = ":".join("%02x" % byte for byte in raw)
        return self._mac

    def rssi(self):
        return -55

    def temperature(self):
        self._celsius = min(55.0, max(30.0, self._celsius + compat.uniform(-0.4, 0.4)))
        return round(self._celsius, 1)

    def set_output(self, name, on):
        self.levels[name] = bool(on)

    def get_output(self, name):
        return self.levels[name]

    def read_adc(self):
        self._millivolts = min(3300, max(0, self._millivolts + int(compat.uniform(-40, 40))))
        return self._millivolts * 65535 // 3300, self._millivolts * 1000

    def set_pixel(self, rgb):
        self.pixel = tuple(rgb)

    def capture(self):
        if not self.camera:
            return None
        from fw_jpeg import solid

        self.photos += 1
        colour = COLOURS[self.photos % len(COLOURS)]
        comment = "esp-mcp-gateway simulated camera, photo %d" % self.photos
        return solid(160, 120, colour, comment.encode())

    def beep(self):
        self.beeps += 1

    def reboot(self):
        self.reset()
        if self.on_reboot:
            self.on_reboot()


def make_board(config):
    """Esp32Board on an ESP32 (unless config board is "sim"), else SimBoard."""
    if config.get("board") != "sim" and sys.platform == "esp32":
        from fw_esp32 import Esp32Board

        return Esp32Board(config)
    return SimBoard(config)
