"""The owner's limits on a device's tool arguments: JSON Schema keywords that narrow its schema.

``[devices."<id>"] limits = { "self.audio_speaker.set_volume" = { volume = { maximum = 60 } } }``
names a tool (its own name, with or without ``self.``), a top-level argument of it, and keywords
of ``KEYWORDS``: numeric bounds, lengths, item counts, a pattern, an enum. A limit narrows the
device's schema and never widens it; a keyword is refused when

- it is not one of ``KEYWORDS`` (``type``, ``default``, ``$ref``, ...: a limit bounds the values
  the device already takes, its schema says what they are), or the keywords are not valid JSON
  Schema (2020-12), or a pattern is one the linear-time engine refuses;
- it does not apply to the argument's type (a ``maximum`` on a string);
- it lets through a value the device's own schema refuses: a ``maximum`` above the device's
  maximum (or at its ``exclusiveMaximum``), a ``minLength`` below its ``minLength``, an ``enum``
  value its schema does not allow, and so on for each bound;
- the argument is not in the tool's ``properties``.

A tool with a refused limit is served to no one (hidden from hosts, its calls refused with the
reason, logged) until the config is mended: a bound the owner asked for is never dropped in
silence, and a firmware that renames an argument does not slip past it. A limit naming a tool the
device does not list is logged and does nothing.

``limited`` applies them once per catalogue a device is given, not per call: the tool's spec gets
the narrowed schema (``tools/list`` shows the bound, so a model sees it before calling) and a
validator that checks the owner's keywords first, worded as the owner's ("volume 80 is above the
owner's limit of 60"), then the device's own schema. Limits bind every caller, the person at the
CLI or dashboard too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema_rs

from gateway.config import Config
from gateway.config.tool_limits import ArgumentLimits
from gateway.devices.catalogue import SAFE_REGEX, ToolSpec
from gateway.devices.device import Verdict

__all__ = ["KEYWORDS", "limited", "log_invalid_limits"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
Keywords = Mapping[str, object]

# Each keyword the owner may set, with the JSON type it bounds (None: any).
_BOUNDS = {
    "minimum": "number",
    "exclusiveMinimum": "number",
    "maximum": "number",
    "exclusiveMaximum": "number",
    "minLength": "string",
    "maxLength": "string",
    "pattern": "string",
    "minItems": "array",
    "maxItems": "array",
    "enum": None,
}
KEYWORDS = tuple(_BOUNDS)

# How a refusal reads, per keyword: the owner's limit named, so a host knows it is not the device's.
_SAID = {
    "minimum": "{argument} {value} is below the owner's limit of {limit}",
    "exclusiveMinimum": "{argument} {value} is not above the owner's limit of {limit}",
    "maximum": "{argument} {value} is above the owner's limit of {limit}",
    "exclusiveMaximum": "{argument} {value} is not below the owner's limit of {limit}",
    "minLength": "{argument} is shorter than the owner's limit of {limit} characters",
    "maxLength": "{argument} is longer than the owner's limit of {limit} characters",
    "pattern": "{argument} {value} does not match the owner's pattern {limit}",
    "minItems": "{argument} has fewer than the owner's limit of {limit} items",
    "maxItems": "{argument} has more than the owner's limit of {limit} items",
    "enum": "{argument} {value} is not one of the owner's choices: {limit}",
}
_VALUE_CHARS = 80

# A bound of the owner's is wider than the device's when it lets through what the device's does
# not: (owner's keyword, device's keyword) -> wider(owner's value, device's value).
_WIDER: dict[tuple[str, str], Callable[[Any, Any], bool]] = {
    ("maximum", "maximum"): operator.gt,
    ("maximum", "exclusiveMaximum"): operator.ge,
    ("exclusiveMaximum", "maximum"): operator.gt,
    ("exclusiveMaximum", "exclusiveMaximum"): operator.gt,
    ("minimum", "minimum"): operator.lt,
    ("minimum", "exclusiveMinimum"): operator.le,
    ("exclusiveMinimum", "minimum"): operator.lt,
    ("exclusiveMinimum", "exclusiveMinimum"): operator.lt,
    ("maxLength", "maxLength"): operator.gt,
    ("minLength", "minLength"): operator.lt,
    ("maxItems", "maxItems"): operator.gt,
    ("minItems", "minItems"): operator.lt,
}


class _Refused(Exception):
    """A limit that cannot be applied; the text says why."""


def limited(
    label: str, specs: Sequence[ToolSpec], verdicts: Sequence[Verdict], limits: ArgumentLimits
) -> tuple[list[ToolSpec], list[Verdict]]:
    """The tools ``specs`` of device ``label`` with its ``limits`` applied, and their verdicts.

    A tool with limits gets a narrowed spec; one whose limits cannot all be applied keeps its
    spec and gets a refusal, for the model and the person alike (both logged).
    """
    by_name = {spec.name: spec for spec in specs}
    mine: dict[str, Mapping[str, Keywords]] = {}
    for tool, arguments in limits.items():
        name = tool if tool in by_name else f"self.{tool}"
        if name not in by_name:
            logger.warning("%s: limits name %s, a tool the device does not list", label, tool)
            continue
        mine[name] = arguments
    narrowed, decided = list(specs), list(verdicts)
    for index, spec in enumerate(specs):
        if spec.name not in mine:
            continue
        try:
            narrowed[index] = _narrowed(spec, mine[spec.name])
        except _Refused as exc:
            reason = f"{spec.name} is not served: the owner's limits on it cannot be applied: {exc}"
            logger.warning("%s: %s (mend its limits in the config)", label, reason)
            decided[index] = (reason, reason, verdicts[index][2])
    return narrowed, decided


def log_invalid_limits(config: Config) -> None:
    """Log, at start, the limits that are wrong in themselves (whatever a device will list)."""
    for device_id, options in config.devices.items():
        for tool, arguments in options.limits.items():
            for argument, keywords in arguments.items():
                try:
                    _owner_validator(argument, keywords)
                except _Refused as exc:
                    logger.warning(
                        'devices."%s".limits: %s: %s; the tool will not be served',
                        device_id, tool, exc,
                    )  # fmt: skip


# --- narrowing one tool ----------------------------------------------------------------------


def _narrowed(spec: ToolSpec, limits: Mapping[str, Keywords]) -> ToolSpec:
    schema = spec.input_schema
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    merged = dict(properties)
    checks = []
    for argument, keywords in limits.items():
        own = properties.get(argument)
        if own is True:
            own = {}  # the device takes any value
        if not isinstance(own, dict):
            raise _Refused(f"{spec.name} has no argument {argument!r}")
        validator = _owner_validator(argument, keywords)
        for keyword, value in keywords.items():
            _check_narrows(spec, argument, own, keyword, value)
        merged[argument] = _merged(own, keywords)
        checks.append(_Check(argument, keywords, validator))
    text = json.dumps({a: dict(k) for a, k in limits.items()}, sort_keys=True)
    return dataclasses.replace(
        spec,
        input_schema={**schema, "properties": merged},
        # tools grouped by schema (tools.mode = "grouped") group only with equal limits
        schema_key=hashlib.sha256((spec.schema_key + text).encode()).hexdigest()[:16],
        size=spec.size + len(text),
        validator=_Limited(tuple(checks), spec.validator),
    )


def _owner_validator(argument: str, keywords: Keywords) -> Any:
    """The owner's keywords for ``argument`` compiled, once they prove valid in themselves."""
    if not keywords:
        raise _Refused(f"{argument}: no keywords (limits take {', '.join(KEYWORDS)})")
    for keyword in keywords:
        if keyword not in _BOUNDS:
            raise _Refused(
                f"{argument}: {keyword} is not a limit (limits take {', '.join(KEYWORDS)}; "
                "the device's schema says what an argument is, a limit only bounds it)"
            )
    schema = dict(keywords)
    try:
        json.dumps(schema, allow_nan=False)
        jsonschema_rs.meta.validate(schema)  # 2020-12: no $schema can be named here
        return jsonschema_rs.validator_for(schema, offline=True, pattern_options=SAFE_REGEX)
    except (ValueError, TypeError, jsonschema_rs.ReferencingError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _Refused(f"{argument}: not valid JSON Schema: {message}") from None


def _check_narrows(
    spec: ToolSpec, argument: str, own: JsonObject, keyword: str, value: object
) -> None:
    """Refuse ``keyword`` = ``value`` on ``argument`` if it would widen the device's ``own``."""
    kind = _BOUNDS[keyword]
    types = own.get("type")
    types = {types} if isinstance(types, str) else set(types) if isinstance(types, list) else None
    if kind == "number" and types is not None and not types & {"number", "integer"}:
        raise _Refused(f"{argument}: {keyword} bounds numbers, and {argument} is {_types(types)}")
    if kind is not None and kind != "number" and types is not None and kind not in types:
        raise _Refused(f"{argument}: {keyword} bounds {kind}s, and {argument} is {_types(types)}")
    for (mine, theirs), wider in _WIDER.items():
        device_value = own.get(theirs)
        if mine != keyword or device_value is None:
            continue
        if isinstance(device_value, bool):  # draft 4's exclusiveMaximum: true beside maximum
            raise _Refused(f"{argument}: the device bounds it the draft 4 way; limits cannot")
        if wider(value, device_value):
            raise _Refused(
                f"{argument}: {keyword} {_json(value)} is wider than the device's own {theirs} "
                f"of {_json(device_value)} (a limit may only narrow the device's schema)"
            )
    if keyword == "enum":
        for choice in value if isinstance(value, list) else ():
            if any(list(e.instance_path)[:1] == [argument]
                   for e in spec.validator.iter_errors({argument: choice})):  # fmt: skip
                raise _Refused(
                    f"{argument}: enum value {_json(choice)} is one the device's own schema "
                    "does not allow (a limit may only narrow the device's schema)"
                )


def _merged(own: JsonObject, keywords: Keywords) -> JsonObject:
    """The argument's schema as hosts see it: the device's, with the owner's keywords in."""
    merged = {**own, **keywords}
    if "pattern" in keywords and "pattern" in own:  # both apply: the device's stays, beside it
        merged["pattern"] = own["pattern"]
        merged["allOf"] = [*own.get("allOf", []), {"pattern": keywords["pattern"]}]
    return merged


# --- checking a call -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Check:
    """The owner's limit on one argument, compiled."""

    argument: str
    keywords: Keywords
    validator: Any


@dataclass(frozen=True, slots=True)
class _Refusal:
    """A call's argument outside the owner's limit, as ``ToolSpec.problems`` reads an error."""

    message: str
    instance_path: tuple[str, ...] = ()


class _Limited:
    """A tool's validator: the owner's limits first, in the owner's words, then the device's."""

    __slots__ = ("checks", "device")

    def __init__(self, checks: tuple[_Check, ...], device: Any) -> None:
        self.checks = checks
        self.device = device

    def is_valid(self, arguments: object) -> bool:
        """True when the arguments keep every limit and fit the device's schema."""
        return next(self._outside(arguments), None) is None and self.device.is_valid(arguments)

    def iter_errors(self, arguments: object) -> Iterator[Any]:
        """Every limit the arguments break, then every error of the device's schema."""
        yield from self._outside(arguments)
        yield from self.device.iter_errors(arguments)

    def _outside(self, arguments: object) -> Iterator[_Refusal]:
        if not isinstance(arguments, dict):
            return
        for check in self.checks:
            if check.argument not in arguments:
                continue  # a limit bounds what is sent, not the device's default
            value = arguments[check.argument]
            for error in check.validator.iter_errors(value):
                keyword = str(list(error.schema_path)[-1])
                limit = check.keywords[keyword]
                shown = _choices(limit) if keyword == "enum" else _json(limit)
                yield _Refusal(
                    _SAID[keyword].format(argument=check.argument, value=_json(value), limit=shown)
                )


def _json(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 1] + "…"


def _choices(limit: object) -> str:
    return ", ".join(_json(choice) for choice in limit) if isinstance(limit, list) else ""


def _types(types: set[str]) -> str:
    return " or ".join(f"{'an' if t[0] in 'aeiou' else 'a'} {t}" for t in sorted(types))
