"""The default tool catalogue of one simulated board (docs/protocol.md §6).

Common tools come first with the stock descriptions, then the board's own tools, then the
user-only ones, in the order stock firmware lists them. Descriptions are long on purpose: with
``withUserTools`` the catalogue spans three 8000-byte ``tools/list`` pages, so anything that
lists a device has to follow ``nextCursor`` more than once.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from device_fw.fw_board import COLOURS
from device_fw.fw_camera import DESCRIPTION as CAMERA_DESCRIPTION
from device_fw.fw_camera import explain
from device_fw.fw_jpeg import solid

from . import descriptions as d
from .errors import DeviceReboot, ToolError
from .simtool import Args, Handler, JsonObject, Prop, SimTool

__all__ = ["BoardState", "camera_tool", "default_tools"]

_RELAYS = range(1, 5)
# ESP32-S3: 19/20 are the USB pins, 26-32 the SPI flash and 33-37 the octal PSRAM.
_RESERVED_PINS = frozenset({19, 20, *range(26, 38)})


@dataclass(slots=True)
class BoardState:
    """Everything the default tools read and change; one instance per simulated device.

    Volume, brightness and theme survive a reboot (stock keeps them in NVS); the rest is RAM.
    """

    device_id: str = "02:00:00:00:00:01"
    client_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    board: str = "sim-esp32"
    fw_version: str = "2.4.2"
    volume: int = 70
    brightness: int = 75
    theme: str = "light"
    lamp_on: bool = False
    relays: dict[int, bool] = field(default_factory=lambda: dict.fromkeys(_RELAYS, False))
    gpio: dict[int, bool] = field(default_factory=dict)
    led: tuple[int, int, int, int] = (0, 0, 0, 0)
    message: tuple[str, int] | None = None
    temperature: float = 23.5
    rng: random.Random = field(default_factory=random.Random)
    boot_time: float = field(default_factory=time.monotonic)
    photos: int = 0

    def uptime(self) -> int:
        """Seconds since the (simulated) boot."""
        return int(time.monotonic() - self.boot_time)

    def read_temperature(self) -> float:
        """Return the chip temperature in °C, drifting a little with every reading."""
        self.temperature = min(32.0, max(18.0, self.temperature + self.rng.uniform(-0.3, 0.3)))
        return round(self.temperature, 1)

    def capture(self) -> bytes:
        """Take a photo: a 160x120 JPEG of one colour, another with every photo (the firmware's
        simulated camera, device_fw/fw_board.py)."""
        self.photos += 1
        comment = f"esp-mcp-gateway simulated camera, photo {self.photos}"
        return solid(160, 120, COLOURS[self.photos % len(COLOURS)], comment.encode())

    def reboot(self) -> None:
        """Lose what a real board keeps only in RAM and restart the uptime clock."""
        self.lamp_on = False
        self.relays = dict.fromkeys(_RELAYS, False)
        self.gpio = {}
        self.led = (0, 0, 0, 0)
        self.message = None
        self.boot_time = time.monotonic()

    def status(self) -> JsonObject:
        """The ``self.get_device_status`` document (stock shape plus lamp and uptime)."""
        return {
            "audio_speaker": {"volume": self.volume},
            "screen": {"brightness": self.brightness, "theme": self.theme},
            "lamp": {"power": self.lamp_on},
            "chip": {"temperature": self.read_temperature()},
            "uptime": self.uptime(),
            "network": {"type": "wifi", "ssid": "SimulatedWiFi", "signal": "strong"},
        }

    def system_info(self) -> JsonObject:
        """The ``self.get_system_info`` document: the OTA request body (§3), abridged."""
        return {
            "version": 2,
            "language": "en-US",
            "flash_size": 16777216,
            "minimum_free_heap_size": "123456",
            "mac_address": self.device_id,
            "uuid": self.client_id,
            "chip_model_name": "esp32s3",
            "application": {"name": "xiaozhi", "version": self.fw_version},
            "board": {"type": self.board, "name": self.board, "mac": self.device_id},
        }


def default_tools(board: BoardState | None = None, camera: SimTool | None = None) -> list[SimTool]:
    """Return the default catalogue, every tool acting on ``board`` (a fresh one if None).

    ``camera`` (see :func:`camera_tool`) goes after the common tools, where stock lists it.
    """
    state = board if board is not None else BoardState()
    return [
        *_common_tools(state),
        *([camera] if camera is not None else []),
        *_lamp_tools(state),
        *_sensor_and_light_tools(state),
        *_relay_tools(state),
        *_gpio_tools(state),
        *_board_system_tools(state),
        _slow_tool(),
        *_user_tools(state),
    ]


def _common_tools(state: BoardState) -> list[SimTool]:
    def get_status(args: Args) -> JsonObject:
        return state.status()

    def set_volume(args: Args) -> bool:
        state.volume = args.integer("volume")
        return True

    def set_brightness(args: Args) -> bool:
        state.brightness = args.integer("brightness")
        return True

    def set_theme(args: Args) -> bool:
        theme = args.string("theme")
        if theme not in ("light", "dark"):
            return False
        state.theme = theme
        return True

    percent = Prop("integer", minimum=0, maximum=100)
    return [
        SimTool("self.get_device_status", _D_STATUS, {}, get_status),
        SimTool("self.audio_speaker.set_volume", _D_VOLUME, {"volume": percent}, set_volume),
        SimTool("self.screen.set_brightness", _D_BRIGHT, {"brightness": percent}, set_brightness),
        SimTool("self.screen.set_theme", _D_THEME, {"theme": Prop("string")}, set_theme),
    ]


def camera_tool(state: BoardState, vision: Callable[[], tuple[str, str] | None]) -> SimTool:
    """``self.camera.take_photo`` of a stock camera board (docs/protocol.md §5).

    It uploads ``state``'s photo to the vision URL that ``vision()`` returns (the one the last
    ``initialize`` passed) with the firmware's own upload code (device_fw/fw_camera.py), and
    returns the server's answer.
    """

    async def take_photo(args: Args) -> str:
        jpeg = state.capture()
        return await explain(
            vision(), state.device_id, state.client_id, args.string("question"), jpeg
        )

    return SimTool(
        "self.camera.take_photo", CAMERA_DESCRIPTION, {"question": Prop("string")}, take_photo
    )


def _lamp_tools(state: BoardState) -> list[SimTool]:
    def get_state(args: Args) -> JsonObject:
        return {"power": state.lamp_on}

    def turn_on(args: Args) -> bool:
        state.lamp_on = True
        return True

    def turn_off(args: Args) -> bool:
        state.lamp_on = False
        return True

    return [
        SimTool("self.lamp.get_state", d.LAMP_GET, {}, get_state),
        SimTool("self.lamp.turn_on", d.LAMP_ON, {}, turn_on),
        SimTool("self.lamp.turn_off", d.LAMP_OFF, {}, turn_off),
    ]


def _sensor_and_light_tools(state: BoardState) -> list[SimTool]:
    def read_temperature(args: Args) -> str:
        return f"{state.read_temperature():.1f}"

    def set_color(args: Args) -> bool:
        rgb = (args.integer("r"), args.integer("g"), args.integer("b"))
        state.led = (*rgb, args.integer("brightness"))
        return True

    channel = Prop("integer", minimum=0, maximum=255)
    color = {"r": channel, "g": channel, "b": channel}
    brightness = Prop("integer", default=50, minimum=0, maximum=100)
    return [
        SimTool("self.sensor.read_temperature", d.TEMPERATURE, {}, read_temperature),
        SimTool(
            "self.led_strip.set_color", d.LED_STRIP, {**color, "brightness": brightness}, set_color
        ),
    ]


def _relay_tools(state: BoardState) -> list[SimTool]:
    def set_relay(args: Args) -> bool:
        state.relays[args.integer("channel")] = args.boolean("on")
        return True

    def get_relays(args: Args) -> JsonObject:
        return {"relays": [{"channel": ch, "on": on} for ch, on in state.relays.items()]}

    async def pulse(args: Args) -> bool:
        channel = args.integer("channel")
        state.relays[channel] = True
        try:
            await asyncio.sleep(args.integer("duration_ms") / 1000)
        finally:
            state.relays[channel] = False
        return True

    channel = Prop("integer", minimum=1, maximum=4)
    duration = Prop("integer", default=500, minimum=50, maximum=10000)
    return [
        SimTool(
            "self.relay.set", d.RELAY_SET, {"channel": channel, "on": Prop("boolean")}, set_relay
        ),
        SimTool("self.relay.get_states", d.RELAY_GET, {}, get_relays),
        SimTool(
            "self.relay.pulse", d.RELAY_PULSE, {"channel": channel, "duration_ms": duration}, pulse
        ),
    ]


def _gpio_tools(state: BoardState) -> list[SimTool]:
    def pin_of(args: Args) -> int:
        pin = args.integer("pin")
        if pin in _RESERVED_PINS:
            raise ToolError(f"GPIO {pin} is reserved (USB, flash or PSRAM) and cannot be used")
        return pin

    def set_level(args: Args) -> bool:
        state.gpio[pin_of(args)] = args.boolean("level")
        return True

    def get_level(args: Args) -> bool:
        return state.gpio.get(pin_of(args), False)

    pin = Prop("integer", minimum=0, maximum=48)
    return [
        SimTool(
            "self.gpio.set_level", d.GPIO_SET, {"pin": pin, "level": Prop("boolean")}, set_level
        ),
        SimTool("self.gpio.get_level", d.GPIO_GET, {"pin": pin}, get_level),
    ]


def _board_system_tools(state: BoardState) -> list[SimTool]:
    def show_message(args: Args) -> bool:
        state.message = (args.string("text"), args.integer("duration_s"))
        return True

    duration = Prop("integer", default=10, minimum=1, maximum=300)
    message = {"text": Prop("string"), "duration_s": duration}
    return [
        SimTool("self.screen.show_message", d.SHOW_MESSAGE, message, show_message),
        # Stock wifi boards reboot into the access-point mode inside the call, so no reply.
        SimTool("self.system.reconfigure_wifi", d.RECONFIGURE_WIFI, {}, _rebooter(state)),
    ]


def _slow_tool() -> SimTool:
    async def wait(args: Args) -> str:
        seconds = args.integer("seconds")
        await asyncio.sleep(seconds)
        return f"Waited {seconds} second{'' if seconds == 1 else 's'}"

    seconds = Prop("integer", default=2, minimum=0, maximum=60)
    return SimTool("self.slow.wait", d.SLOW_WAIT, {"seconds": seconds}, wait)


def _rebooter(state: BoardState) -> Handler:
    async def reboot(args: Args) -> bool:
        # docs/protocol.md §4 "Concurrency": the reboot runs before the reply is queued,
        # so the caller never gets an answer.
        state.reboot()
        raise DeviceReboot

    return reboot


def _user_tools(state: BoardState) -> list[SimTool]:
    def system_info(args: Args) -> JsonObject:
        return state.system_info()

    reboot = _rebooter(state)
    # Stock bug kept on purpose (§6): the description was passed as the default, so `url`
    # is optional and its "default" is prose.
    firmware_url = Prop(
        "string", default="The URL of the firmware binary file to download and install"
    )
    return [
        SimTool("self.get_system_info", "Get the system information", {}, system_info, True),
        SimTool("self.reboot", "Reboot the system", {}, reboot, True),
        SimTool("self.upgrade_firmware", _D_UPGRADE, {"url": firmware_url}, reboot, True),
    ]


_D_STATUS = (
    "Provides the real-time information of the device, including the current status of the audio "
    "speaker, screen, battery, network, etc.\nUse this tool for: \n1. Answering questions about "
    "current condition (e.g. what is the current volume of the audio speaker?)\n2. As the first "
    "step to control the device (e.g. turn up / down the volume of the audio speaker, etc.)"
)
_D_VOLUME = (
    "Set the volume of the audio speaker. If the current volume is unknown, you must call "
    "`self.get_device_status` tool first and then call this tool."
)
_D_BRIGHT = "Set the brightness of the screen."
_D_THEME = "Set the theme of the screen. The theme can be `light` or `dark`."
_D_UPGRADE = (
    "Upgrade firmware from a specific URL. This will download and install the firmware, then "
    "reboot the device."
)
