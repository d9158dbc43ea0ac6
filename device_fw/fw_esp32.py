"""A real ESP32 (ESP32_GENERIC, S2, S3, C3, C6 firmware): machine, network, neopixel, esp32.

Only imported on a board (fw_board.make_board); every module used here is frozen into stock
MicroPython for ESP32, except ``camera``, which only camera builds have (config "camera").
"""

import asyncio
import os

import machine
import network

import fw_compat as compat
from fw_board import Board

try:
    import esp32
except ImportError:
    esp32 = None

WIFI_TIMEOUT_MS = 20000


class Esp32Board(Board):
    """Outputs on GPIO pins, an ADC pin, an optional NeoPixel strip, Wi-Fi station."""

    name = "esp32"

    def __init__(self, config):
        super().__init__(config)
        self.wifi = config["wifi"]
        self.hostname = config.get("name") or ""
        self.chip = os.uname().machine.split(" with ")[-1].lower()  # e.g. "esp32s3"
        self.name = self.chip
        self.wlan = network.WLAN(network.STA_IF)
        self._pins = {}
        for name, (pin, inverted) in self.outputs.items():
            self._pins[name] = machine.Pin(pin, machine.Pin.OUT, value=1 if inverted else 0)
        self._adc = None
        if self.adc_pin is not None:
            self._adc = machine.ADC(machine.Pin(self.adc_pin))
            if hasattr(machine.ADC, "ATTN_11DB"):
                self._adc.atten(machine.ADC.ATTN_11DB)  # the full 0..3.3 V range
        self._pixels = None
        if self.pixel_pin is not None:
            import neopixel

            self._pixels = neopixel.NeoPixel(machine.Pin(self.pixel_pin), self.pixel_count)
        self._camera = open_camera(config.get("camera")) if config.get("camera") else None
        self._display = open_display(self.display_pins) if self.display_pins else None
        self.camera = self._camera is not None

    async def start_network(self):
        wlan = self.wlan
        if wlan.isconnected():
            return
        if not self.wifi.get("ssid"):
            raise OSError("config: wifi.ssid is empty")
        wlan.active(True)
        if self.hostname and hasattr(network, "hostname"):
            network.hostname(self.hostname)
        wlan.connect(self.wifi["ssid"], self.wifi.get("password") or "")
        started = compat.ticks_ms()
        while not wlan.isconnected():
            if compat.ticks_diff(compat.ticks_ms(), started) > WIFI_TIMEOUT_MS:
                wlan.disconnect()
                raise OSError("Wi-Fi %r: no connection within 20 s" % self.wifi["ssid"])
            await asyncio.sleep_ms(200)
        compat.log(compat.INFO, "Wi-Fi up: %s", wlan.ifconfig()[0])

    def mac(self):
        return ":".join("%02x" % byte for byte in self.wlan.config("mac"))

    def rssi(self):
        try:
            return self.wlan.status("rssi") if self.wlan.isconnected() else None
        except (OSError, ValueError):
            return None

    def temperature(self):
        # S2/S3/C3/C6 have a calibrated sensor; the original ESP32's raw one is not usable.
        if esp32 is not None and hasattr(esp32, "mcu_temperature"):
            return esp32.mcu_temperature()
        return None

    def set_output(self, name, on):
        inverted = self.outputs[name][1]
        self._pins[name].value(1 if bool(on) != inverted else 0)

    def get_output(self, name):
        return bool(self._pins[name].value()) != self.outputs[name][1]

    def read_adc(self):
        adc = self._adc
        return adc.read_u16(), adc.read_uv() if hasattr(adc, "read_uv") else None

    def set_pixel(self, rgb):
        self._pixels.fill(tuple(rgb))
        self._pixels.write()

    def capture(self):
        try:
            frame = self._camera.capture()
        except Exception as exc:  # the drivers raise OSError, RuntimeError...
            compat.log(compat.WARNING, "camera: %r", exc)
            return None
        # bytes(): a copy, because the driver reuses its frame buffer for the next capture,
        # which a second call may take while this photo is still being uploaded.
        return bytes(frame) if frame else None

    def show(self, status, message, emotion):
        screen = self._display
        if screen is None:
            return
        screen.fill(0)
        screen.text(status[:16], 0, 0)
        for row in range(6):  # 16 characters a row, under the status line
            screen.text(message[row * 16 : row * 16 + 16], 0, 16 + row * 8)
        screen.show()

    def beep(self):
        if self.buzzer_pin is not None:
            asyncio.create_task(self._beep())

    async def _beep(self):
        pwm = machine.PWM(machine.Pin(self.buzzer_pin), freq=2000, duty_u16=32768)
        try:
            await asyncio.sleep_ms(150)
        finally:
            pwm.deinit()

    def reboot(self):
        machine.reset()


def open_display(pins):
    """An SSD1306 128x64 on I2C at ``pins`` (its driver from micropython-lib: ``mip install
    ssd1306``), or None when the driver or the display is missing."""
    try:
        import ssd1306

        i2c = machine.SoftI2C(sda=machine.Pin(pins["sda"]), scl=machine.Pin(pins["scl"]))
        return ssd1306.SSD1306_I2C(128, 64, i2c)
    except Exception as exc:  # ImportError, OSError (nothing answers on the bus)...
        compat.log(compat.WARNING, "display: cannot start it: %r", exc)
        return None


def open_camera(spec):
    """The camera of config "camera": true (the build's own pins) or an object of the
    driver's keyword arguments (pins...); None if this MicroPython has no camera module."""
    try:
        import camera
    except ImportError:
        compat.log(compat.WARNING, "config camera: this MicroPython build has no camera")
        return None
    options = dict(spec) if isinstance(spec, dict) else {}
    try:
        if hasattr(camera, "Camera"):  # cnadler86/micropython-camera-API (S3 camera builds)
            options["pixel_format"] = camera.PixelFormat.JPEG
            if "frame_size" in options:  # a name such as "VGA"
                options["frame_size"] = getattr(camera.FrameSize, options["frame_size"])
            return camera.Camera(**options)
        camera.init(0, format=camera.JPEG, **options)  # lemariva's driver (ESP32-CAM builds)
        return camera
    except Exception as exc:
        compat.log(compat.ERROR, "camera: cannot start it: %r", exc)
        return None
