"""Pipeline spec strings: `fold-bn,insert-quantize{after=Relu|AvgPool},calibrate{method=entropy}`."""

from __future__ import annotations

import re

import attrs

from qcc.errors import UsageError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:\-]*")


@attrs.frozen
class PassSpec:
    name: str
    options: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        if not self.options:
            return self.name
        return self.name + "{" + ",".join(f"{k}={_quote(v)}" for k, v in self.options) + "}"


def _quote(value: str) -> str:
    return f'"{value}"' if any(c in value for c in ',{}="') else value


def parse_spec(text: str) -> list[PassSpec]:
    """Parse a pipeline spec; errors point at the column."""
    specs: list[PassSpec] = []
    pos = 0
    text = text.strip()

    def error(what: str) -> UsageError:
        return UsageError(f"pipeline spec {text!r}: {what} at column {pos + 1}")

    if not text:
        return specs
    while pos < len(text):
        while pos < len(text) and text[pos] == " ":
            pos += 1
        m = _NAME.match(text, pos)
        if not m:
            raise error("expected a pass name")
        name, pos = m.group(), m.end()
        options: list[tuple[str, str]] = []
        if pos < len(text) and text[pos] == "{":
            pos += 1
            while True:
                m = _NAME.match(text, pos)
                if not m:
                    raise error("expected an option name")
                key, pos = m.group(), m.end()
                if pos >= len(text) or text[pos] != "=":
                    raise error(f"expected '=' after option {key!r}")
                pos += 1
                if pos < len(text) and text[pos] == '"':
                    end = text.find('"', pos + 1)
                    if end < 0:
                        raise error("unterminated quote")
                    value, pos = text[pos + 1:end], end + 1
                else:
                    start = pos
                    while pos < len(text) and text[pos] not in ",}":
                        pos += 1
                    value = text[start:pos].strip()
                if any(k == key for k, _ in options):
                    raise error(f"option {key!r} given twice")
                options.append((key, value))
                if pos < len(text) and text[pos] == ",":
                    pos += 1
                    continue
                if pos < len(text) and text[pos] == "}":
                    pos += 1
                    break
                raise error("expected ',' or '}'")
        specs.append(PassSpec(name, tuple(options)))
        while pos < len(text) and text[pos] == " ":
            pos += 1
        if pos < len(text):
            if text[pos] != ",":
                raise error("expected ','")
            pos += 1
            if pos >= len(text):
                raise error("trailing ','")
    return specs


def format_spec(specs: list[PassSpec]) -> str:
    return ",".join(str(s) for s in specs)
