"""Tests for gateway.protocol.envelope: framing device messages."""

from __future__ import annotations

import json
import re

import pytest

from gateway.errors import LocalProtocolError
from gateway.protocol import envelope
from gateway.protocol.envelope import (
    MalformedMessage,
    MessageTooLarge,
    check_session_id,
    decode,
    encode,
    mcp_envelope,
    new_session_id,
    result_text,
    salvage_error_reply,
    server_hello,
    stock_reply_id,
    too_large,
    utf8_length,
)

STOCK_ERROR = (
    '{"session_id":"","type":"mcp","payload":{"jsonrpc":"2.0","id":5,'
    '"error":{"message":"Missing valid argument: "x""}}}'
)


def test_decode_returns_message_object() -> None:
    """A well-formed frame decodes to its object."""
    assert decode('{"session_id":"S","type":"listen","state":"stop"}', 100) == {
        "session_id": "S",
        "type": "listen",
        "state": "stop",
    }


def test_decode_accepts_raw_control_characters_in_strings() -> None:
    """The device copies newlines into strings unescaped; they are accepted."""
    assert decode('{"type":"stt","text":"a\nb"}', 100)["text"] == "a\nb"


def test_decode_accepts_frame_of_exactly_max_bytes() -> None:
    """The limit is inclusive."""
    text = '{"type":"x"}'
    assert decode(text, len(text))["type"] == "x"


def test_decode_rejects_oversize_frame() -> None:
    """A frame longer than max_bytes raises MessageTooLarge."""
    with pytest.raises(MessageTooLarge):
        decode('{"type":"hello"}', 10)


def test_decode_counts_utf8_bytes_not_characters() -> None:
    """Multi-byte characters count by their UTF-8 length."""
    text = '{"type":"é"}'
    with pytest.raises(MessageTooLarge):
        decode(text, len(text))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("not json", "invalid JSON"),
        ("[" * 100_000, "invalid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('"hello"', "not a JSON object"),
        ('{"session_id":"S"}', "missing or non-string type"),
        ('{"type":5}', "missing or non-string type"),
    ],
)
def test_decode_rejects_malformed_frame(text: str, reason: str) -> None:
    """Frames that are not objects with a string type raise MalformedMessage with a reason."""
    with pytest.raises(MalformedMessage, match=reason):
        decode(text, 1_000_000)


def test_salvage_rebuilds_stock_error_with_unescaped_message() -> None:
    """An error reply with raw quotes in its message becomes a well-formed mcp message."""
    with pytest.raises(MalformedMessage):
        decode(STOCK_ERROR, 1000)
    assert salvage_error_reply(STOCK_ERROR) == {
        "session_id": "",
        "type": "mcp",
        "payload": {"jsonrpc": "2.0", "id": 5, "error": {"message": 'Missing valid argument: "x"'}},
    }


def test_salvage_tolerates_whitespace_and_missing_session_id() -> None:
    """Whitespace between tokens and a missing session id are tolerated."""
    text = (
        ' { "type" : "mcp", "payload" : { "jsonrpc":"2.0", "id" : 7,'
        ' "error" : { "message" : "a"b" } } } '
    )
    assert salvage_error_reply(text) == {
        "session_id": "",
        "type": "mcp",
        "payload": {"jsonrpc": "2.0", "id": 7, "error": {"message": 'a"b'}},
    }


def test_salvage_keeps_session_id() -> None:
    """The session id of the broken frame is kept."""
    text = STOCK_ERROR.replace('"session_id":""', '"session_id":"abc-1"')
    salvaged = salvage_error_reply(text)
    assert salvaged is not None
    assert salvaged["session_id"] == "abc-1"


@pytest.mark.parametrize(
    "text",
    [
        "garbage",
        '{"session_id":"","type":"mcp","payload":{"jsonrpc":"2.0","id":5,"result":{"x":"a"b"}}}',
        '{"session_id":"","type":"listen","payload":{"jsonrpc":"2.0","id":5,"error":{"message":"x"}}}',
        '{"session_id":"","type":"mcp","payload":{"jsonrpc":"2.0","id":"5","error":{"message":"x"}}}',
    ],
)
def test_salvage_ignores_anything_but_an_mcp_error_reply(text: str) -> None:
    """Only the shape of a stock error reply is salvaged."""
    assert salvage_error_reply(text) is None


def test_encode_is_compact_and_keeps_non_ascii() -> None:
    """Frames have no spaces and keep UTF-8 characters as they are."""
    assert encode({"type": "stt", "text": "你好"}) == '{"type":"stt","text":"你好"}'


def test_encode_escapes_lone_surrogates() -> None:
    """A lone surrogate cannot be sent as UTF-8, so the frame falls back to ASCII escapes."""
    text = encode({"type": "x", "text": "é\ud800"})
    assert text == '{"type":"x","text":"\\u00e9\\ud800"}'
    text.encode("utf-8")


def test_encode_rejects_nan() -> None:
    """NaN is not JSON."""
    with pytest.raises(ValueError):
        encode({"type": "x", "value": float("nan")})


def test_too_large_encodes_only_where_the_character_count_cannot_decide(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A text is measured by its character count alone when that decides (1 to 4 UTF-8 bytes a
    character, one when ASCII): only non-ASCII text with between a quarter of ``max_bytes`` and
    ``max_bytes`` characters is encoded once more to be measured."""
    encoded: list[str] = []

    def counted(text: str) -> int:
        encoded.append(text)
        return utf8_length(text)

    monkeypatch.setattr(envelope, "utf8_length", counted)
    assert not too_large("温度" * 100, 800)  # 200 characters: 800 bytes at most
    assert not too_large("x" * 800, 800) and too_large("x" * 801, 800)
    assert too_large("温" * 801, 800)
    assert encoded == []
    assert too_large("温度" * 134, 800)  # 804 bytes
    assert not too_large("温度" * 133 + "xx", 800)  # 800 bytes
    assert encoded == ["温度" * 134, "温度" * 133 + "xx"]


def test_utf8_length_counts_bytes() -> None:
    """Length is in UTF-8 bytes, and lone surrogates do not raise."""
    assert utf8_length("aé你") == 6
    assert utf8_length("\ud800") == 3


def test_mcp_envelope_wraps_payload() -> None:
    """The payload travels under type mcp with our session id."""
    payload = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert mcp_envelope("abc", payload) == {"session_id": "abc", "type": "mcp", "payload": payload}


def test_server_hello_has_string_transport_and_audio_params() -> None:
    """The hello carries the transport as a string (a stock device crashes otherwise)."""
    hello = server_hello("abc", "websocket")
    assert hello == {
        "type": "hello",
        "transport": "websocket",
        "session_id": "abc",
        "audio_params": {
            "format": "opus",
            "sample_rate": 24000,
            "channels": 1,
            "frame_duration": 60,
        },
    }
    assert json.loads(encode(hello)) == hello


@pytest.mark.parametrize("transport", [None, "", 1])
def test_server_hello_rejects_non_string_transport(transport: object) -> None:
    """A missing, empty or non-string transport is refused before it reaches a device."""
    with pytest.raises(LocalProtocolError):
        server_hello("abc", transport)  # type: ignore[arg-type]


@pytest.mark.parametrize("session_id", ["", 'a"b', "a b", "ä", "a\\b", 5])
def test_check_session_id_rejects_unsafe_ids(session_id: object) -> None:
    """Only [A-Za-z0-9-] is safe: the device concatenates the id into JSON unescaped."""
    with pytest.raises(LocalProtocolError):
        check_session_id(session_id)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        mcp_envelope(session_id, {})  # type: ignore[arg-type]


def test_new_session_id_is_plain_and_unique() -> None:
    """Fresh session ids use only [A-Za-z0-9-] and differ from each other."""
    ids = {new_session_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"[A-Za-z0-9-]+", i) for i in ids)
    assert all(check_session_id(i) == i for i in ids)


STOCK_HEAD = '{"session_id":"s-1","type":"mcp","payload":{"jsonrpc":"2.0","id":7,"result":'


def test_result_text_is_the_raw_result_of_a_stock_framed_reply() -> None:
    """The text after the fixed head of a stock reply decides its result alone."""
    result = '{"tools":[{"name":"a"}],"nextCursor":"x"}'
    assert result_text(STOCK_HEAD + result + "}}", "s-1", 7) == result
    empty = '{"session_id":"","type":"mcp","payload":{"jsonrpc":"2.0","id":7,"result":{}}}'
    assert result_text(empty, "", 7) == "{}"  # replies before any hello carry ""


@pytest.mark.parametrize(
    ("text", "session_id", "request_id"),
    [
        (STOCK_HEAD + "{}}}", "s-2", 7),  # another session's head
        (STOCK_HEAD + "{}}}", "s-1", 8),  # another request's
        (STOCK_HEAD + "{}}}", "s-1", True),  # a bool is no request id
        (STOCK_HEAD + "{}}}", "s-1", "7"),
        (STOCK_HEAD + "{}}}", None, 7),
        (STOCK_HEAD.replace("s-1", 's\\"1') + "{}}}", 's"1', 7),  # would need escaping
        (STOCK_HEAD.replace(",", ", ") + "{}}}", "s-1", 7),  # other spacing
        (STOCK_HEAD + "{}} ", "s-1", 7),  # trailing text
    ],
)
def test_result_text_refuses_any_other_framing(
    text: str, session_id: object, request_id: object
) -> None:
    assert result_text(text, session_id, request_id) is None


def test_stock_reply_id_reads_the_id_of_a_stock_framed_reply_from_its_head() -> None:
    """Results and errors alike, in any session (the empty one before a hello too)."""
    assert stock_reply_id(STOCK_HEAD + "{}}}") == 7
    assert stock_reply_id(STOCK_ERROR) == 5
    big = STOCK_HEAD.replace('"id":7', '"id":4294967295')
    assert stock_reply_id(big + "{}}}") == 4294967295  # the bounds are the caller's to keep


@pytest.mark.parametrize(
    "text",
    [
        STOCK_HEAD.replace('"id":7', '"id":' + "9" * 11) + "{}}}",  # too long to be one
        STOCK_HEAD.replace('"id":7', '"id":07') + "{}}}",  # not JSON's way to write 7
        STOCK_HEAD.replace('"id":7', '"id":-7') + "{}}}",
        STOCK_HEAD.replace('"id":7', '"id":7.5') + "{}}}",
        STOCK_HEAD.replace('"id":7', '"id":"7"') + "{}}}",
        STOCK_HEAD.replace('"result"', '"method"') + '"x"}}',  # a request of the device's
        STOCK_HEAD.replace(",", ", ") + "{}}}",  # other spacing: parsed, not read
        " " + STOCK_HEAD + "{}}}",
        STOCK_HEAD.replace("s-1", 's\\"1') + "{}}}",
        '{"type":"mcp","payload":{"jsonrpc":"2.0","id":7,"result":{}}}',  # other keys
        "not json",
    ],
)
def test_stock_reply_id_leaves_any_other_frame_to_a_parse(text: str) -> None:
    assert stock_reply_id(text) is None
