"""Tool declarations for fw_mcp: Tool, its Prop list, and the stock argument rules.

A Prop without a default is required; a value of the wrong JSON type counts as absent
(docs/protocol.md 4, "Arguments"). Needs only fw_envelope.py.
"""

import fw_envelope as env
from fw_envelope import ToolError

KINDS = ("boolean", "integer", "number", "string")


class Prop:
    """An input property of kind boolean/integer/number/string; required iff no default."""

    def __init__(self, name, kind, default=None, minimum=None, maximum=None, description=None):
        if kind not in KINDS:
            raise ValueError("unknown property type " + str(kind))
        if (minimum is not None or maximum is not None) and kind in ("boolean", "string"):
            raise ValueError("a %s property cannot have a minimum or maximum" % kind)
        self.name = name
        self.kind = kind
        self.default = default
        self.minimum = minimum
        self.maximum = maximum
        self.description = description
        if default is not None:
            value = self.coerce(default)
            if value is None or value != default or type(value) is not type(default):
                raise ValueError("default %r is not a %s" % (default, kind))
            if self.range_error(value):
                raise ValueError("default %r is out of range" % (default,))

    def schema(self):
        """The property's JSON schema."""
        schema = {"type": self.kind}
        for key in ("description", "default", "minimum", "maximum"):
            if getattr(self, key) is not None:
                schema[key] = getattr(self, key)
        return schema

    def coerce(self, value):
        """``value`` as this property's type, or None if its JSON type differs."""
        kind = self.kind
        if kind == "boolean":
            return value if value is True or value is False else None
        if kind == "string":
            return value if isinstance(value, str) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        if kind == "number":
            return value
        try:
            return int(value)  # stock reads numbers through cJSON's valueint: truncated
        except (OverflowError, ValueError):
            return None

    def range_error(self, value):
        """The stock message for a number out of range, or None."""
        if self.kind in ("boolean", "string"):
            return None
        if self.minimum is not None and value < self.minimum:
            return "Value is below minimum allowed: %s" % self.minimum
        if self.maximum is not None and value > self.maximum:
            return "Value exceeds maximum allowed: %s" % self.maximum
        return None


class Tool:
    """A tool. user=True: listed only for withUserTools (audience ["user"]); hints: MCP
    annotations such as {"title": "Status", "readOnlyHint": True}; output: the JSON Schema
    of the object the handler returns (MCP outputSchema), which then also goes out as
    structuredContent."""

    def __init__(self, name, description, props=(), handler=None, user=False, hints=None,
                 output=None):  # fmt: skip
        self.name = name
        self.description = description
        self.props = list(props)
        self.handler = handler
        self.user = user
        self.hints = hints
        self.output = output

    def to_json(self):
        """The tool as tools/list shows it."""
        schema = {"type": "object", "properties": {p.name: p.schema() for p in self.props}}
        required = [p.name for p in self.props if p.default is None]
        if required:
            schema["required"] = required
        tool = {"name": self.name, "description": self.description, "inputSchema": schema}
        if self.output:
            tool["outputSchema"] = self.output
        annotations = dict(self.hints) if self.hints else {}
        if self.user:
            annotations["audience"] = ["user"]
        if annotations:
            tool["annotations"] = annotations
        return tool

    def result(self, value):
        """The tools/call result for the handler's return ``value``."""
        result = {"content": [{"type": "text", "text": text_of(value)}], "isError": False}
        if self.output:
            # MCP 2025-06-18: structuredContent for clients that read the schema; the text
            # (the same object as JSON) for older ones and for stock-minded gateways.
            result["structuredContent"] = value
        return result

    def parse(self, arguments):
        """Every declared property's value from ``arguments``, or ToolError.

        Stock rules: undeclared keys are ignored, a value of the wrong type counts as absent.
        """
        values = {}
        for prop in self.props:
            value = prop.coerce(arguments.get(prop.name)) if prop.name in arguments else None
            if value is None:
                if prop.default is None:
                    raise ToolError("Missing valid argument: " + prop.name, env.INVALID_PARAMS)
                value = prop.default
            problem = prop.range_error(value)
            if problem:
                raise ToolError(problem, env.INVALID_PARAMS)
            values[prop.name] = value
        return values


def text_of(value):
    """A handler's return value as result text, as stock McpTool::Call renders it."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    return env.dumps(value)
