"""The 25-tool catalogue every emulated device of ``fleet.py`` serves, and its pages.

All devices share this one catalogue, as a fleet of identical stock boards would, so that a
gateway may share catalogues between devices. The tools follow stock xiaozhi firmware
(docs/protocol.md §6): names like ``self.audio_speaker.set_volume``, descriptions in the
stock style (a summary, "Use this tool for", Args, Return), input schemas with integer ranges,
strings, booleans and defaults, plus a few enums. The descriptions are long enough that the
catalogue spans three ``tools/list`` pages under the stock 8000-byte page rule (§4), so a
gateway follows ``nextCursor`` twice for every device.

Everything a device sends is serialised here once, at import: a device only pastes the
pre-made result into its envelope, which keeps thousands of them cheap in a few processes.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["CALL_RESULT", "INIT_RESULT", "PAGES", "TOOL_COUNT", "TOOLS", "page_for"]

JsonObject = dict[str, Any]

PAGE_LIMIT = 8000  # bytes per tools/list page on stock firmware (mcp_server.cc:452-506)


def _int(low: int, high: int, default: int | None = None) -> JsonObject:
    schema: JsonObject = {"type": "integer"}
    if default is not None:
        schema["default"] = default
    return {**schema, "minimum": low, "maximum": high}


def _str(default: str | None = None, enum: list[str] | None = None) -> JsonObject:
    schema: JsonObject = {"type": "string"}
    if default is not None:
        schema["default"] = default
    if enum is not None:
        schema["enum"] = enum
    return schema


def _bool(default: bool | None = None) -> JsonObject:
    return {"type": "boolean"} if default is None else {"type": "boolean", "default": default}


# (name, summary, uses, properties, returns); a property is required iff it has no default,
# as on stock firmware.
_SPECS: list[tuple[str, str, list[str], JsonObject, str]] = [
    ("self.get_device_status",
     "Provides the real-time information of the device, including the current status of the "
     "audio speaker, screen, battery, network, etc.",
     ["Answering questions about current condition (e.g. what is the current volume of the "
      "audio speaker?)",
      "As the first step to control the device (e.g. turn up / down the volume of the audio "
      "speaker, etc.)"],
     {}, "A JSON object with the state of every part of the board."),
    ("self.audio_speaker.set_volume",
     "Set the volume of the audio speaker. If the current volume is unknown, you must call "
     "`self.get_device_status` tool first and then call this tool.",
     ["`louder` / `quieter` / `set the volume to 30`"],
     {"volume": _int(0, 100)}, "`true` once the volume is set."),
    ("self.audio_speaker.set_mute",
     "Mute or unmute the audio speaker without losing the volume setting.",
     ["`be quiet for a while`, `mute`", "`unmute`, `you can talk again`"],
     {"muted": _bool()}, "`true` once the speaker is (un)muted."),
    ("self.screen.set_brightness", "Set the brightness of the screen.",
     ["`the screen is too bright` / `too dark`", "`set the brightness to 40 percent`"],
     {"brightness": _int(0, 100)}, "`true` once the brightness is set."),
    ("self.screen.set_theme",
     "Set the theme of the screen. The theme can be `light` or `dark`.",
     ["`dark mode please`", "`switch to the light theme`"],
     {"theme": _str(enum=["light", "dark"])}, "`true`, or `false` for an unknown theme."),
    ("self.screen.show_message",
     "Show a short text message on the screen for a while, e.g. a reminder or a note for "
     "someone else in the room.",
     ["`write 'back in 5 minutes' on the screen`", "`show the shopping list`"],
     {"text": _str(), "duration_s": _int(1, 300, 10)}, "`true` once the message is shown."),
    ("self.camera.take_photo",
     "Always remember you have a camera. If the user asks you to see something, use this tool "
     "to take a photo and then explain it.",
     ["`what do you see?`", "`read this label for me`"],
     {"question": _str()}, "A JSON object that provides the photo information."),
    ("self.lamp.get_state",
     "The power state of the lamp connected to this board (the desk lamp).",
     ["Answering `is the light on?`", "Before toggling the lamp when its state is unknown"],
     {}, 'A JSON object `{"power": true}` when the lamp is on, else `{"power": false}`.'),
    ("self.lamp.turn_on", "Turn on the lamp connected to this board.",
     ["`turn on the light`, `it is too dark`"], {}, "`true` once the lamp is on."),
    ("self.lamp.turn_off", "Turn off the lamp connected to this board.",
     ["`turn off the light`, `good night`"], {}, "`true` once the lamp is off."),
    ("self.light.set_rgb",
     "Set the colour of the RGB light ring as red, green and blue channels.",
     ["`make the light red`", "`a warm white please`"],
     {"r": _int(0, 255), "g": _int(0, 255), "b": _int(0, 255)}, "`true` once the colour is set."),
    ("self.led_strip.set_effect",
     "Run a lighting effect on the LED strip at the given speed.",
     ["`party mode`, `rainbow`", "`make it breathe slowly`"],
     {"effect": _str(enum=["solid", "rainbow", "breathe", "blink", "chase"]),
      "speed": _int(1, 100, 50)}, "`true` once the effect runs."),
    ("self.sensor.read_temperature",
     "Read the temperature measured by the on-board sensor, in degrees Celsius.",
     ["`how warm is it in here?`"], {}, "The temperature as text, e.g. `23.5`."),
    ("self.sensor.read_humidity",
     "Read the relative humidity measured by the on-board sensor, in percent.",
     ["`is the air dry?`"], {}, "The humidity as text, e.g. `41`."),
    ("self.relay.set", "Switch one of the four relay channels on or off.",
     ["`turn on the fan` (the fan is on channel 2)", "`switch off channel 3`"],
     {"channel": _int(1, 4), "on": _bool()}, "`true` once the relay is switched."),
    ("self.relay.get_states", "The state of all four relay channels.",
     ["`what is switched on?`"], {}, 'A JSON object `{"relays": [{"channel": 1, "on": false}]}`.'),
    ("self.relay.pulse",
     "Switch a relay channel on for a short time, then off again (a door opener, a bell).",
     ["`open the door`", "`ring the bell`"],
     {"channel": _int(1, 4), "duration_ms": _int(50, 10000, 500)}, "`true` after the pulse."),
    ("self.gpio.set_level", "Drive a free GPIO pin high or low.",
     ["Controlling something wired to a GPIO pin"],
     {"pin": _int(0, 48), "level": _bool()}, "`true` once the pin is set."),
    ("self.gpio.get_level", "Read the level of a GPIO pin.",
     ["Reading a button or a contact wired to a GPIO pin"],
     {"pin": _int(0, 48), "pull_up": _bool(False)}, "`true` when the pin is high."),
    ("self.fan.set_speed", "Set the speed of the fan connected to this board.",
     ["`fan on high`", "`turn the fan down`"],
     {"speed": _str(enum=["off", "low", "medium", "high"])}, "`true` once the speed is set."),
    ("self.timer.set", "Start a countdown timer that rings when it ends.",
     ["`set a timer for 10 minutes`", "`remind me in an hour to take the cake out`"],
     {"seconds": _int(1, 86400), "label": _str("timer")}, "`true` once the timer runs."),
    ("self.timer.cancel", "Cancel a running countdown timer by its label.",
     ["`cancel the timer`", "`never mind the cake timer`"],
     {"label": _str("timer")}, "`true` if a timer was cancelled."),
    ("self.alarm.set", "Set the daily alarm clock to a time of day (24-hour `HH:MM`).",
     ["`wake me up at 6:30`", "`set an alarm for 7`"],
     {"time": _str(), "repeat": _bool(False)}, "`true` once the alarm is set."),
    ("self.set_press_to_talk",
     "Switch between press-to-talk (hold the button while speaking) and click-to-talk.",
     ["`I want to hold the button while I talk`"],
     {"mode": _str(enum=["press_to_talk", "click_to_talk"])}, "`true` once the mode is set."),
    ("self.system.reconfigure_wifi",
     "End this conversation and enter WiFi configuration mode.\n**CAUTION** You must ask the "
     "user to confirm this action.",
     ["`connect to another WiFi network`"], {}, "Nothing: the board restarts at once."),
]  # fmt: skip


# What a board's tools say about the part they drive, by the part (the name's middle segment):
# stock board tools carry such context for the model, and it is what fills three pages.
_PARTS: dict[str, str] = {
    "get_device_status": "The status is read from the hardware at the time of the call, never "
    "cached, so call it again rather than reuse an old answer. 查询设备的实时状态。",
    "audio_speaker": "The speaker is a 3 W mono speaker behind the front grille; the volume "
    "survives a reboot (it is kept in flash). Speech from the assistant uses the same speaker, "
    "so a muted or silent speaker also silences your answers: warn the user before muting, and "
    "never go below 10 unless asked. 调节扬声器。",
    "screen": "The screen is a 240x240 colour LCD above the speaker; brightness and theme "
    "survive a reboot. At brightness 0 the backlight is off but the screen still works: tell "
    "the user how to bring it back (ask for a higher brightness). 设置屏幕。",
    "camera": "The camera is a 2 MP OV2640 at the top of the board, facing the user. The photo "
    "is sent to the configured vision service together with the question; it is not stored "
    "on the board. Ask before taking a photo of a person who is not the user. 拍照并解释。",
    "lamp": "The lamp is a 12 V LED desk lamp switched by a MOSFET on GPIO 10: it is either on "
    "or off, it cannot be dimmed and has no colour (use the light ring or the LED strip for "
    "that). After a reboot the lamp is off. 控制台灯。",
    "light": "The light ring has 12 RGB LEDs around the screen. Colours are mixed from red, "
    "green and blue, 0..255 each: white is 255,255,255, warm white about 255,180,100, off is "
    "0,0,0. The ring stays as set until the next call or a reboot. 设置灯环颜色。",
    "led_strip": "The LED strip is a 2 m strip of 60 WS2812 pixels behind the shelf. Effects run "
    "until another effect is chosen or the board reboots; `solid` keeps the last colour. Fast "
    "blinking can bother people: prefer `breathe` unless asked. 灯带效果。",
    "sensor": "The sensor is an SHT40 next to the board's vent, away from the chip, so its "
    "reading is the room's, give or take half a degree. Readings are taken at each call, so "
    "two calls a second apart may differ slightly. 读取传感器。",
    "relay": "Channel 1 is the kettle, channel 2 the fan, channel 3 the fish-tank pump and "
    "channel 4 the door opener. Relays are off after a reboot. **CAUTION** Ask before "
    "switching channel 1 or 4 on: they drive mains power and the front door. 控制继电器。",
    "gpio": "Pins 19/20 (USB), 26-32 (flash) and 33-37 (PSRAM) are reserved: a call for one "
    "of them fails. Levels are lost at reboot. Only use this tool when the user names a pin, "
    "never to guess what is wired where. 读写引脚。",
    "fan": "The fan is a 12 V PC fan on a PWM pin; `off` stops it completely, `low` is nearly "
    "silent and `high` is loud. The speed survives a reboot. 调节风扇。",
    "timer": "Timers run on the board, ring through the speaker when they end and are lost at "
    "a reboot. Several timers may run at once; each has a label (`timer` by default), so name "
    "them after what they are for. 倒计时。",
    "alarm": "There is one daily alarm; setting it again replaces it. The board keeps local "
    "time from the network, so say the time as the user said it; repeat makes it ring every "
    "day until it is set again. 闹钟。",
    "set_press_to_talk": "The mode is kept in flash. In click-to-talk mode the board listens "
    "after one click until the user stops speaking; in press-to-talk it listens while the "
    "button is held. 对话模式。",
    "system": "The board restarts into its access-point mode `Xiaozhi-XXXX`; the user then "
    "connects a phone to it to choose a network. The conversation ends. 重新配网。",
}


def _part(name: str) -> str:
    segments = name.split(".")
    return segments[1] if len(segments) > 1 else name


def _description(summary: str, uses: list[str], props: JsonObject, returns: str) -> str:
    lines = [summary, "Use this tool for:"]
    lines += [f"{n}. {use}" for n, use in enumerate(uses, 1)]
    if props:
        lines.append("Args:")
        for name, schema in props.items():
            kind = schema["type"]
            if "minimum" in schema:
                kind += f" {schema['minimum']}..{schema['maximum']}"
            if "enum" in schema:
                kind += " (" + " | ".join(schema["enum"]) + ")"
            if "default" in schema:
                kind += f", default {json.dumps(schema['default'])}"
            lines.append(f"  `{name}`: {kind}")
        lines.append(f"Example arguments: {json.dumps(_example(props), ensure_ascii=False)}")
    lines += ["Return:", f"  {returns}"]
    return "\n".join(lines)


def _example(props: JsonObject) -> JsonObject:
    example: JsonObject = {}
    for name, schema in props.items():
        if "default" in schema:
            example[name] = schema["default"]
        elif "enum" in schema:
            example[name] = schema["enum"][-1]
        elif schema["type"] == "integer":
            example[name] = (schema["minimum"] + schema["maximum"]) // 2
        else:
            example[name] = True if schema["type"] == "boolean" else "…"
    return example


def _tool(name: str, summary: str, uses: list[str], props: JsonObject, returns: str) -> JsonObject:
    summary = f"{summary}\n{_PARTS[_part(name)]}"
    schema: JsonObject = {"type": "object", "properties": props}
    required = [p for p, s in props.items() if "default" not in s]
    if required:
        schema["required"] = required
    return {
        "name": name,
        "description": _description(summary, uses, props, returns),
        "inputSchema": schema,
    }


def _paginate(tools: list[JsonObject]) -> list[tuple[str, str]]:
    """``[(cursor, result JSON)]``: the pages as stock firmware cuts them (§4).

    A tool joins the page if the page so far, the tool and its comma, plus 30 bytes of slack,
    fit in 8000 bytes; otherwise the page ends and ``nextCursor`` names that tool.
    """
    pages: list[tuple[str, str]] = []
    cursor, start = "", 0
    while start < len(tools):
        body, end = '{"tools":[', start
        while end < len(tools):
            item = json.dumps(tools[end], ensure_ascii=False, separators=(",", ":")) + ","
            if len(body.encode()) + len(item.encode()) + 30 > PAGE_LIMIT:
                break
            body, end = body + item, end + 1
        if end == start:
            raise ValueError(f"tool {tools[start]['name']} alone exceeds a page")
        body = body.rstrip(",") + "]"
        if end < len(tools):
            body += f',"nextCursor":"{tools[end]["name"]}"'
        pages.append((cursor, body + "}"))
        cursor, start = (tools[end]["name"] if end < len(tools) else ""), end
    return pages


TOOLS: list[JsonObject] = [_tool(*spec) for spec in _SPECS]
TOOL_COUNT = len(TOOLS)
PAGES: list[tuple[str, str]] = _paginate(TOOLS)
_PAGE_BY_CURSOR = {cursor: index for index, (cursor, _) in enumerate(PAGES)}

INIT_RESULT = json.dumps(
    {
        "protocolVersion": "2024-11-05",
        "capabilities": {"tools": {}},
        "serverInfo": {"name": "bench-board", "version": "1.0.0"},
    },
    separators=(",", ":"),
)
CALL_RESULT = '{"content":[{"type":"text","text":"ok"}],"isError":false}'


def page_for(cursor: str) -> tuple[str, bool] | None:
    """The result JSON for ``cursor`` and whether it is the last page; None for a bad cursor."""
    index = _PAGE_BY_CURSOR.get(cursor)
    if index is None:
        return None
    return PAGES[index][1], index == len(PAGES) - 1
