"""A device catalogue judged once, when it arrives: typed tools, rejections, and sharing.

Every tool entry a device lists is checked on its own (``judge``). A tool that could harm a host
or the gateway is *rejected* with a reason, and the device's other tools are served:

- its name must be text (no lone surrogates, no control characters) of at most 128 characters,
  and not repeat an earlier tool's;
- its description must be text of at most 8 KiB;
- its ``inputSchema`` must be a JSON Schema object (``type`` absent or ``"object"``) that passes
  its metaschema, is at most 32 levels deep and 16 KiB as JSON, and compiles with the
  linear-time regex engine and without fetching anything: a device's ``pattern`` can then never
  stall the event loop (``^(a+)+$`` costs nothing), and a remote ``$ref`` is refused, not fetched.
  Every check is offline: the metaschema is one of the drafts the engine holds (2020-12 when
  ``$schema`` is absent); a ``$schema`` naming any other URL rejects the tool, and nothing a
  schema names (``$schema``, ``$ref``, ``$id``) is ever fetched, from the network or a file.
- an ``outputSchema``, where the device declares one, passes the same checks: hosts validate
  the results' ``structuredContent`` against it, and so does the gateway before passing it on.

Of the device's ``annotations``, the gateway keeps ``audience`` (user-only tools) and the hints
hosts show: ``title``, ``readOnlyHint``, ``destructiveHint`` (each only when it has the right type).

What a judged tool keeps is exactly what can be served again, so the store keeps only that.
Devices running the same firmware list the same entries: ``Catalogues`` interns catalogues by
content digest, so such devices share one ``Catalogue`` (its tools, schemas and compiled
validators) and a device costs a reference.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import jsonschema_rs

__all__ = ["Catalogue", "Catalogues", "Rejection", "ToolSpec", "judge"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]

MAX_NAME_CHARS = 128
MAX_DESCRIPTION_BYTES = 8192
MAX_SCHEMA_BYTES = 16384
MAX_SCHEMA_DEPTH = 32
_REASON_CHARS = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Bounds the memory one device pattern may compile to (the engine's own default is 10 MiB).
SAFE_REGEX = jsonschema_rs.RegexOptions(size_limit=1 << 20, dfa_size_limit=1 << 20)
_KNOWN_DRAFTS = "JSON Schema drafts 4, 6, 7, 2019-09 and 2020-12"  # what the engine holds


def _never_fetch(uri: str, /) -> NoReturn:
    raise ValueError(f"{uri} is not fetched: device schemas are checked offline")


# Meta-validation without a registry fetches whatever "$schema" names (http, even file://), on
# the event loop; with one, it finds only the drafts it holds and fetches nothing (and should a
# version ever ask the retriever, it refuses).
_OFFLINE = jsonschema_rs.Registry([], retriever=_never_fetch)


class _Reject(Exception):
    """The tool entry cannot be served; the text says why."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A device tool that passed every check, with what the gateway needs to serve it."""

    name: str
    description: str
    input_schema: JsonObject
    user_only: bool
    schema_key: str  # equal for equal schemas: tools of the same name and schema group together
    size: int  # about how many bytes the tool takes in a tools/list result
    validator: Any = field(repr=False, compare=False)  # a compiled jsonschema_rs validator
    title: str | None = None
    read_only: bool | None = None  # the device's own hints; None where it gave none
    destructive: bool | None = None
    output_schema: JsonObject | None = None
    output_validator: Any = field(default=None, repr=False, compare=False)

    def problems(self, arguments: JsonObject) -> list[str]:
        """What is wrong with ``arguments`` for this tool, one clear sentence each."""
        try:
            if self.validator.is_valid(arguments):  # the common case, without error objects
                return []
            errors = list(self.validator.iter_errors(arguments))
        except Exception as exc:  # the engine refused the instance; never send it unchecked
            return [f"the arguments cannot be checked: {_first_line(exc)}"]
        problems = []
        for error in sorted(errors, key=lambda e: [str(p) for p in e.instance_path]):
            where = "/".join(str(p) for p in error.instance_path)
            problems.append(f"argument {where!r}: {error.message}" if where else error.message)
        return problems

    def output_problems(self, structured: object) -> list[str]:
        """What is wrong with a result's ``structuredContent`` for this tool's outputSchema."""
        if self.output_validator is None:
            return []
        try:
            errors = list(self.output_validator.iter_errors(structured))
        except Exception as exc:
            return [f"the result cannot be checked: {_first_line(exc)}"]
        return [error.message for error in errors[:3]]

    def as_entry(self) -> JsonObject:
        """The tool as the store keeps it (and as ``judge`` takes it back)."""
        entry: JsonObject = {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
        }
        if self.output_schema is not None:
            entry["outputSchema"] = self.output_schema
        annotations: JsonObject = {"audience": ["user"]} if self.user_only else {}
        for key, value in (
            ("title", self.title),
            ("readOnlyHint", self.read_only),
            ("destructiveHint", self.destructive),
        ):
            if value is not None:
                annotations[key] = value
        if annotations:
            entry["annotations"] = annotations
        return entry


@dataclass(frozen=True, slots=True)
class Rejection:
    """A tool entry that was not served: its name (printable, None if it had none) and why."""

    tool: str | None
    reason: str


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)
class Catalogue:
    """One judged catalogue, shared by every device that lists the same entries."""

    digest: str
    tools: tuple[ToolSpec, ...]
    rejected: tuple[Rejection, ...] = ()
    _by_name: dict[str, ToolSpec] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._by_name.update((tool.name, tool) for tool in self.tools)

    def tool(self, name: str) -> ToolSpec | None:
        """The tool called ``name`` (the device's own name), if it was accepted."""
        return self._by_name.get(name)

    def to_json(self) -> str:
        """What the store keeps: the accepted tools and the rejections, nothing else."""
        return json.dumps(
            {
                "tools": [tool.as_entry() for tool in self.tools],
                "rejected": [[r.tool, r.reason] for r in self.rejected],
            },
            ensure_ascii=False,
        )


def digest_of(entries: Sequence[object]) -> str:
    """The content digest of a device's tool entries (equal entries, equal digest)."""
    hasher = hashlib.sha256()
    for index, entry in enumerate(entries):
        try:
            text = json.dumps(entry, sort_keys=True, separators=(",", ":"))
        except (ValueError, TypeError, RecursionError):
            text = f"!{index}"  # judged unservable anyway; only needs to be deterministic
        hasher.update(text.encode("utf-8", "surrogatepass"))
        hasher.update(b"\n")
    return hasher.hexdigest()


def judge(entries: Sequence[object], digest: str | None = None) -> Catalogue:
    """Check every entry alone; return the catalogue of those that pass, and why others failed."""
    tools: list[ToolSpec] = []
    rejected: list[Rejection] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        name = _printable_name(entry)
        try:
            tool = _check_tool(entry)
            if tool.name in seen:
                raise _Reject("a tool of the same name came earlier")
        except _Reject as exc:
            rejected.append(Rejection(name, str(exc) or f"entry {index} cannot be served"))
            continue
        seen.add(tool.name)
        tools.append(tool)
    return Catalogue(digest or digest_of(entries), tuple(tools), tuple(rejected))


def from_json(digest: str, text: str) -> Catalogue:
    """A catalogue the store kept, judged again (an older version may have kept a bad tool).

    Raises:
        ValueError: ``text`` is not a stored catalogue.
    """
    stored = json.loads(text)
    if not isinstance(stored, dict) or not isinstance(stored.get("tools"), list):
        raise ValueError("not a stored catalogue")
    catalogue = judge(stored["tools"], digest)
    kept = [Rejection(*pair) for pair in stored.get("rejected", []) if _is_rejection(pair)]
    return Catalogue(digest, catalogue.tools, (*kept, *catalogue.rejected))


def _is_rejection(pair: object) -> bool:
    return (
        isinstance(pair, list)
        and len(pair) == 2
        and (pair[0] is None or _is_text(pair[0]))
        and _is_text(pair[1])
    )


class Catalogues:
    """Interns catalogues by content: devices listing the same entries share one ``Catalogue``.

    A catalogue lives as long as a device holds it. Judging is the expensive part: a join with a
    known catalogue only hashes its entries, or not even that when the caller has their digest.
    """

    def __init__(self) -> None:
        self._by_digest: weakref.WeakValueDictionary[str, Catalogue] = weakref.WeakValueDictionary()

    def get(self, entries: Sequence[object], digest: str | None = None) -> tuple[Catalogue, bool]:
        """The catalogue of ``entries``; the flag is True when it was judged just now.

        ``digest`` names their content when the caller knows it (the protocol hashes the pages'
        raw text as they arrive, ``ToolCatalog.digest``); else it is computed here, which
        serialises every entry again.
        """
        if digest is None:
            digest = digest_of(entries)
        known = self._by_digest.get(digest)
        if known is not None:
            return known, False
        catalogue = self._by_digest[digest] = judge(entries, digest)
        return catalogue, True

    def load(self, stored: Iterable[tuple[str, str]]) -> dict[str, Catalogue]:
        """Catalogues from the store, by digest; one that cannot be read is left out (logged)."""
        loaded: dict[str, Catalogue] = {}
        for digest, text in stored:
            try:
                catalogue = from_json(digest, text)
            except (ValueError, TypeError, RecursionError):
                logger.warning("stored catalogue %s cannot be read; dropped", digest[:12])
                continue
            loaded[digest] = self._by_digest.setdefault(digest, catalogue)
        return loaded


# --- the checks ----------------------------------------------------------------------------


def _check_tool(entry: object) -> ToolSpec:
    if not isinstance(entry, dict):
        raise _Reject("the entry is not an object")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise _Reject("the tool has no name")
    if not _is_text(name) or _CONTROL.search(name):
        raise _Reject("the name is not valid text (lone surrogates or control characters)")
    if len(name) > MAX_NAME_CHARS:
        raise _Reject(f"the name is longer than {MAX_NAME_CHARS} characters")
    description = entry.get("description")
    if description is None:
        description = ""
    if not isinstance(description, str) or not _is_text(description):
        raise _Reject("the description is not valid text")
    if len(description.encode()) > MAX_DESCRIPTION_BYTES:
        raise _Reject(f"the description is larger than {MAX_DESCRIPTION_BYTES} bytes")
    schema, schema_text = _check_schema("inputSchema", entry.get("inputSchema"))
    output_schema, output_text = None, ""
    if entry.get("outputSchema") is not None:
        output_schema, output_text = _check_schema("outputSchema", entry["outputSchema"])
    annotations = entry.get("annotations")
    if not isinstance(annotations, dict):
        annotations = {}
    title = annotations.get("title")
    if not isinstance(title, str) or not _is_text(title) or _CONTROL.search(title):
        title = None
    elif not 0 < len(title) <= MAX_NAME_CHARS:
        title = None
    read_only, destructive = annotations.get("readOnlyHint"), annotations.get("destructiveHint")
    return ToolSpec(
        name=name,
        description=description,
        input_schema=schema,
        user_only=annotations.get("audience") == ["user"],
        schema_key=hashlib.sha256((schema_text + output_text).encode()).hexdigest()[:16],
        size=len(name) + len(description.encode()) + len((schema_text + output_text).encode()),
        validator=_compile("inputSchema", schema),
        title=title,
        read_only=read_only if isinstance(read_only, bool) else None,
        destructive=destructive if isinstance(destructive, bool) else None,
        output_schema=output_schema,
        output_validator=None if output_schema is None else _compile("outputSchema", output_schema),
    )


def _check_schema(key: str, schema: object) -> tuple[JsonObject, str]:
    """The schema to serve, and its canonical JSON text."""
    if schema is None:
        schema = {"type": "object", "properties": {}}  # a tool without arguments
    if not isinstance(schema, dict):
        raise _Reject(f"{key} is not an object")
    if schema.get("type", "object") != "object":
        raise _Reject(f'{key} must describe an object ("type": "object")')
    if _depth(schema) > MAX_SCHEMA_DEPTH:
        raise _Reject(f"{key} is nested deeper than {MAX_SCHEMA_DEPTH} levels")
    try:
        text = json.dumps(schema, ensure_ascii=False, allow_nan=False, sort_keys=True)
        size = len(text.encode())
    except UnicodeEncodeError:
        raise _Reject(f"{key} is not valid text (lone surrogates)") from None
    except (ValueError, TypeError):
        raise _Reject(f"{key} is not plain JSON (NaN or Infinity)") from None
    if size > MAX_SCHEMA_BYTES:
        raise _Reject(f"{key} is larger than {MAX_SCHEMA_BYTES} bytes")
    schema = {"type": "object", **schema}
    try:
        jsonschema_rs.meta.validate(schema, registry=_OFFLINE)
    except jsonschema_rs.ReferencingError:
        named = json.dumps(schema.get("$schema"))[: _REASON_CHARS // 2]
        raise _Reject(
            f"{key} names a meta-schema the gateway does not know ($schema {named}): "
            f"schemas are checked offline, against {_KNOWN_DRAFTS}"
        ) from None
    except jsonschema_rs.ValidationError as exc:
        raise _Reject(f"{key} is not a valid JSON Schema: {_first_line(exc)}") from None
    return schema, text


def _compile(key: str, schema: JsonObject) -> Any:
    try:
        return jsonschema_rs.validator_for(schema, offline=True, pattern_options=SAFE_REGEX)
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError) as exc:
        # Patterns the linear-time engine refuses (lookaround, backreferences, huge repeats) and
        # $refs that would need fetching end here: unsafe to check means not served.
        raise _Reject(f"{key} cannot be checked safely: {_first_line(exc)}") from None


def _depth(value: object) -> int:
    """How deeply ``value`` nests, without recursion (a hostile schema may nest deeper)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > MAX_SCHEMA_DEPTH:
                return deepest
        children = (
            node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        )
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


def _is_text(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _printable_name(entry: object) -> str | None:
    name = entry.get("name") if isinstance(entry, dict) else None
    if not isinstance(name, str):
        return None
    # A name kept for display only: any surrogate or control character made visible and safe.
    safe = name.encode("utf-8", "backslashreplace").decode("utf-8")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", safe)[:MAX_NAME_CHARS]


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:_REASON_CHARS]
