"""Text form of the IR for dumps, diffs and golden tests; print -> parse -> print is identical.

```
model "digits" {
  metadata {"producer": "qcc"}
  input %x: float32[N,1,8,8]
  const %w: float32[8,1,3,3] !fixed(8,6) = data "<base64 of the raw bytes>"
  %y: float32[N,8,8,8] = Conv(%x, %w, _) {"group": 1, ...} @"conv1"
  output %y
}
```
Large constants can be elided (`= elided "<sha256>"`, parsed back as zeros with the digest kept)
so dumps of big models stay readable.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

import numpy as np

from qcc.errors import InvalidInputError
from qcc.ir.core import Graph, Model, Node, Value
from qcc.ir.types import DTYPES, Dim, TensorType, parse_quant, quant_text

_BARE = re.compile(r"[A-Za-z0-9_./@'\-]+")


def _name(name: str) -> str:
    return "%" + (name if _BARE.fullmatch(name) else json.dumps(name))


def _type(value: Value) -> str:
    text = f"{_name(value.name)}: {value.type}"
    if value.quant is not None:
        text += f" !{quant_text(value.quant)}"
    return text


def _const_payload(value: Value, elide_above: int | None) -> str:
    data = value.const
    assert data is not None
    raw = np.ascontiguousarray(data).astype(data.dtype.newbyteorder("<"), copy=False).tobytes()
    if "elided_sha256" in value.meta:
        return f'elided "{value.meta["elided_sha256"]}"'
    if elide_above is not None and data.size > elide_above:
        return f'elided "{hashlib.sha256(raw).hexdigest()}"'
    return f'data "{base64.b64encode(raw).decode()}"'


def print_model(model: Model, elide_above: int | None = None) -> str:
    graph = model.graph
    lines = [f"model {json.dumps(graph.name)} {{"]
    meta = {k: v for k, v in model.metadata.items() if _jsonable(v)}
    if meta:
        lines.append(f"  metadata {json.dumps(meta, sort_keys=True)}")
    for value in graph.inputs:
        lines.append(f"  input {_type(value)}")
    for value in graph.constants:
        lines.append(f"  const {_type(value)} = {_const_payload(value, elide_above)}")
    for node in graph.nodes:
        outs = ", ".join(_type(v) for v in node.outputs)
        ins = ", ".join("_" if v is None else _name(v.name) for v in node.inputs)
        attrs = json.dumps(node.attrs, sort_keys=True)
        lines.append(f"  {outs} = {node.op}({ins}) {attrs} @{json.dumps(node.name)}")
    if graph.outputs:
        lines.append("  output " + ", ".join(_name(v.name) for v in graph.outputs))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


class _Scanner:
    def __init__(self, text: str, line_no: int) -> None:
        self.text, self.pos, self.line_no = text, 0, line_no

    def error(self, what: str) -> InvalidInputError:
        return InvalidInputError(f"IR text line {self.line_no}: {what} at column {self.pos + 1}: {self.text.strip()[:80]!r}")

    def ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def peek(self, s: str) -> bool:
        self.ws()
        return self.text.startswith(s, self.pos)

    def expect(self, s: str) -> None:
        if not self.peek(s):
            raise self.error(f"expected {s!r}")
        self.pos += len(s)

    def json(self) -> Any:
        self.ws()
        try:
            value, end = json.JSONDecoder().raw_decode(self.text, self.pos)
        except json.JSONDecodeError:
            raise self.error("bad JSON") from None
        self.pos = end
        return value

    def word(self) -> str:
        self.ws()
        m = re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(self.text, self.pos)
        if not m:
            raise self.error("expected a word")
        self.pos = m.end()
        return m.group()

    def name(self) -> str:
        self.expect("%")
        if self.text.startswith('"', self.pos):
            value = self.json()
            if not isinstance(value, str):
                raise self.error("expected a name")
            return value
        m = _BARE.match(self.text, self.pos)
        if not m:
            raise self.error("expected a name")
        self.pos = m.end()
        return m.group()

    def ttype(self) -> TensorType:
        dtype = self.word()
        if dtype not in DTYPES:
            raise self.error(f"unknown dtype {dtype!r}")
        self.expect("[")
        end = self.text.index("]", self.pos)
        body = self.text[self.pos:end]
        self.pos = end + 1
        dims: list[Dim] = [int(d) if re.fullmatch(r"\d+", d) else d for d in body.split(",") if d != ""]
        return TensorType(dtype, tuple(dims))

    def value_decl(self) -> tuple[str, TensorType, Any]:
        name = self.name()
        self.expect(":")
        ttype = self.ttype()
        quant = None
        if self.peek("!"):
            self.pos += 1
            start, depth = self.pos, 0
            while self.pos < len(self.text):
                ch = self.text[self.pos]
                if ch == "(":
                    depth += 1
                elif ch == ")":
                    depth -= 1
                elif depth == 0 and ch in " ,=":
                    break
                self.pos += 1
            try:
                quant = parse_quant(self.text[start:self.pos])
            except ValueError as exc:
                raise self.error(str(exc)) from None
        return name, ttype, quant


def parse_model(text: str) -> Model:
    lines = [(i + 1, line) for i, line in enumerate(text.splitlines()) if line.strip()]
    if not lines or not lines[0][1].startswith("model "):
        raise InvalidInputError("IR text: must start with 'model \"name\" {'")
    head = _Scanner(lines[0][1], lines[0][0])
    head.expect("model")
    graph = Graph(name=head.json())
    model = Model(graph)
    values: dict[str, Value] = {}

    def lookup(name: str, scanner: _Scanner) -> Value:
        if name not in values:
            raise scanner.error(f"undefined value %{name}")
        return values[name]

    for line_no, line in lines[1:]:
        s = _Scanner(line, line_no)
        if s.peek("}"):
            break
        if s.peek("metadata"):
            s.expect("metadata")
            model.metadata.update(s.json())
        elif s.peek("input "):
            s.expect("input")
            name, ttype, quant = s.value_decl()
            values[name] = graph.add_input(name, ttype)
            values[name].quant = quant
        elif s.peek("const "):
            s.expect("const")
            name, ttype, quant = s.value_decl()
            s.expect("=")
            kind = s.word()
            payload = s.json()
            dtype = DTYPES[ttype.dtype]
            if kind == "data":
                raw = base64.b64decode(payload)
                data = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(
                    [int(d) for d in ttype.shape])
                value = graph.add_constant(name, data)
            elif kind == "elided":
                value = graph.add_constant(name, np.zeros([int(d) for d in ttype.shape], dtype=dtype))
                value.meta["elided_sha256"] = payload
            else:
                raise s.error(f"unknown constant payload {kind!r}")
            value.quant = quant
            values[name] = value
        elif s.peek("output"):
            s.expect("output")
            while True:
                graph.outputs.append(lookup(s.name(), s))
                if not s.peek(","):
                    break
                s.expect(",")
        else:
            decls = [s.value_decl()]
            while s.peek(","):
                s.expect(",")
                decls.append(s.value_decl())
            s.expect("=")
            op = s.word()
            s.expect("(")
            inputs: list[Value | None] = []
            while not s.peek(")"):
                if s.peek("_"):
                    s.expect("_")
                    inputs.append(None)
                else:
                    inputs.append(lookup(s.name(), s))
                if s.peek(","):
                    s.expect(",")
            s.expect(")")
            attrs = s.json()
            s.expect("@")
            node_name = s.json()
            outputs = []
            for name, ttype, quant in decls:
                value = Value(name, ttype, quant=quant)
                values[name] = value
                outputs.append(value)
            graph.nodes.append(Node.create(op, inputs, outputs, attrs, node_name))
    graph._reindex_names()
    return model
