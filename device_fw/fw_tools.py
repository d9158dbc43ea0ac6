"""The firmware's own tools, built over a board (fw_board): what every device offers.

self.get_device_status        firmware, uptime, free memory, Wi-Fi signal, outputs
self.<output>.set_power       switch a GPIO output (LED, relay) on or off
self.<output>.get_state       read it back
self.adc.read                 the ADC pin, raw and in volts
self.chip.get_temperature     the chip's own sensor (only where the chip has one)
self.neopixel.set_color       the NeoPixel strip (only where one is configured)
self.reboot                   user-only: restart the board

Tools that return an object declare its JSON Schema (MCP outputSchema) and so also send it as
structuredContent; every tool carries a title and the MCP hints that fit it.
"""

import asyncio

import fw_envelope as env
from fw_config import VERSION
from fw_mcp import Prop, Tool, ToolError

COLOURS = {
    "off": 0x000000, "black": 0x000000, "white": 0xFFFFFF, "warm": 0xFFB46B,
    "red": 0xFF0000, "green": 0x00FF00, "blue": 0x0000FF, "yellow": 0xFFFF00,
    "cyan": 0x00FFFF, "magenta": 0xFF00FF, "orange": 0xFF8000, "purple": 0x8000FF,
    "pink": 0xFF69B4,
}  # fmt: skip
INT, NUM, STR, BOOL = (
    {"type": "integer"},
    {"type": "number"},
    {"type": "string"},
    {"type": "boolean"},
)


def maybe(kind):
    """``kind`` or null (a reading the board may not have)."""
    return {"type": [kind, "null"]}


def obj(**props):
    """The JSON Schema of an object with exactly these properties, all required."""
    return {"type": "object", "properties": props, "required": sorted(props),
            "additionalProperties": False}  # fmt: skip


def reading(title):
    """Hints of a tool that only reads."""
    return {"title": title, "readOnlyHint": True}


def setting(title):
    """Hints of a tool that sets a state: the same call twice leaves the same state."""
    return {"title": title, "readOnlyHint": False, "destructiveHint": False,
            "idempotentHint": True}  # fmt: skip


def default_tools(board):
    """Every tool this board supports, in listing order."""
    tools = [status_tool(board)]
    for name in sorted(board.outputs):
        tools += output_tools(board, name)
    if board.adc_pin is not None:
        tools.append(adc_tool(board))
    if board.temperature() is not None:
        tools.append(temperature_tool(board))
    if board.pixel_pin is not None:
        tools.append(pixel_tool(board))
    tools.append(reboot_tool(board))
    return tools


def signal(rssi):
    """Stock's words for a Wi-Fi RSSI."""
    if rssi is None:
        return None
    return "strong" if rssi >= -60 else "medium" if rssi >= -70 else "weak"


def status_tool(board):
    def status(args):
        free, used = board.memory()
        rssi = board.rssi()
        return {
            "firmware": VERSION,
            "board": board.name,
            "chip": board.chip,
            "uptime_s": board.uptime(),
            "memory": {"free": free, "used": used},
            "network": {"type": "wifi", "rssi": rssi, "signal": signal(rssi)},
            "outputs": {name: board.get_output(name) for name in board.outputs},
        }

    return Tool(
        "self.get_device_status",
        "The device's current state: firmware version, uptime in seconds, free memory, Wi-Fi "
        "signal and whether each output is on. Use it to answer questions about the device "
        "and before changing something whose state you do not know.",
        (),
        status,
        hints=reading("Device status"),
        output=obj(
            firmware=STR,
            board=STR,
            chip=STR,
            uptime_s=INT,
            memory=obj(free=maybe("integer"), used=maybe("integer")),
            network=obj(type=STR, rssi=maybe("integer"), signal=maybe("string")),
            outputs={"type": "object", "additionalProperties": BOOL},
        ),
    )


def output_tools(board, name):
    """set_power and get_state for the GPIO output ``name`` (an LED, a relay...)."""

    def set_power(args):
        board.set_output(name, args["on"])
        return True

    def get_state(args):
        return {"on": board.get_output(name)}

    pin = board.outputs[name][0]
    return [
        Tool(
            "self.%s.set_power" % name,
            "Switch the %s (GPIO %d) on or off. Returns true once done." % (name, pin),
            [Prop("on", "boolean", description="true to switch on, false to switch off")],
            set_power,
            hints=setting("Switch the " + name),
        ),
        Tool(
            "self.%s.get_state" % name,
            'Whether the %s is on: {"on": true} or {"on": false}.' % name,
            (),
            get_state,
            hints=reading("State of the " + name),
            output=obj(on=BOOL),
        ),
    ]


def adc_tool(board):
    def read(args):
        raw, microvolts = board.read_adc()
        volts = None if microvolts is None else round(microvolts / 1e6, 3)
        return {"pin": board.adc_pin, "raw": raw, "volts": volts}

    return Tool(
        "self.adc.read",
        "Read the analog input on GPIO %d: raw is 0..65535, volts is the calibrated voltage "
        "(0 to about 3.3 V)." % board.adc_pin,
        (),
        read,
        hints=reading("Analog input"),
        output=obj(pin=INT, raw=INT, volts=maybe("number")),
    )


def temperature_tool(board):
    def read(args):
        return {"celsius": board.temperature()}

    return Tool(
        "self.chip.get_temperature",
        "The temperature inside the ESP32 chip in degrees Celsius. It runs warmer than the "
        "room, so it tells how hot the board is, not the air around it.",
        (),
        read,
        hints=reading("Chip temperature"),
        output=obj(celsius=NUM),
    )


def parse_colour(text):
    """(r, g, b) for "#rrggbb", "rrggbb" or a colour name; ToolError for anything else."""
    word = text.strip().lower()
    value = COLOURS.get(word)
    digits = word[1:] if word.startswith("#") else word
    if value is None and len(digits) == 6:
        try:
            value = int(digits, 16)
        except ValueError:
            value = None
    if value is None:
        names = ", ".join(sorted(COLOURS))
        raise ToolError("Unknown colour %r: give #rrggbb or one of %s" % (text, names),
                        env.INVALID_PARAMS)  # fmt: skip
    return value >> 16 & 0xFF, value >> 8 & 0xFF, value & 0xFF


def pixel_tool(board):
    def set_color(args):
        scale = args["brightness"]
        rgb = [channel * scale // 100 for channel in parse_colour(args["color"])]
        board.set_pixel(rgb)
        return {"rgb": rgb}

    return Tool(
        "self.neopixel.set_color",
        "Set the colour of the RGB LED (NeoPixel). color is #rrggbb or a name: "
        + ", ".join(sorted(COLOURS))
        + '. "off" switches it off.',
        [
            Prop("color", "string"),
            Prop("brightness", "integer", 100, 0, 100, "percent of full brightness"),
        ],
        set_color,
        hints=setting("NeoPixel colour"),
        output=obj(rgb={"type": "array", "items": INT, "minItems": 3, "maxItems": 3}),
    )


def reboot_tool(board):
    async def reboot_soon():
        await asyncio.sleep(0.3)  # let the reply leave first
        board.reboot()

    def reboot(args):
        asyncio.create_task(reboot_soon())
        return "Rebooting"

    hints = {"title": "Reboot", "readOnlyHint": False, "destructiveHint": True}
    return Tool("self.reboot", "Reboot the device.", (), reboot, user=True, hints=hints)
