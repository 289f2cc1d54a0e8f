"""IR core: building, verifier, text form, graph surgery (seed 002)."""

from __future__ import annotations

import numpy as np
import pytest

from qcc.errors import InvalidInputError
from qcc.ir import (
    Affine,
    FixedPoint,
    Graph,
    Model,
    Node,
    Sign,
    TensorType,
    Value,
    insert_after,
    match_chains,
    parse_model,
    print_model,
    remove_node,
    replace_node,
    verify_model,
)
from qcc.sim import run_model


def seed002() -> tuple[Model, Value]:
    g = Graph("seed002")
    x = g.add_input("x", TensorType("float32", (1,)))
    h1 = g.add("Add", x, g.add_constant("half", np.array([0.5], np.float32)), name="AddScalar")
    y = g.add("Mul", h1, g.add_constant("minus_two", np.array([-2.0], np.float32)), name="MulScalar")
    g.outputs.append(y)
    return Model(g), h1


def test_seed002_insert_layer_between_existing_layers() -> None:
    model, h1 = seed002()
    zero = {"x": np.zeros(1, np.float32)}
    assert run_model(model, zero)["MulScalar"].tolist() == [-1.0]
    two = model.graph.add_constant("two", np.array([2.0], np.float32))
    node = insert_after(model.graph, h1, "Pow", extra_inputs=[two], name="PowScalar")
    assert verify_model(model) == []
    assert [n.op for n in model.graph.nodes] == ["Add", "Pow", "Mul"]
    assert node.outputs[0].consumers()[0].name == "MulScalar"
    out = run_model(model, zero, keep_all=True)
    assert out["AddScalar"].tolist() == [0.5]
    assert out["PowScalar"].tolist() == [0.25]
    assert out["MulScalar"].tolist() == [-0.5]


def test_replace_and_remove_keep_names_and_attributes() -> None:
    g = Graph("g")
    x = g.add_input("x", TensorType("float32", ("N", 3, 8, 8)))
    p = g.add("MaxPool", x, kernel=[2, 2], strides=[2, 2], name="pool")
    r = g.add("Relu", p, name="act")
    g.outputs.append(r)
    model = Model(g)
    new = replace_node(g, p.producer(), "AvgPool")
    assert new.attrs["kernel"] == [2, 2] and new.attrs["strides"] == [2, 2]
    assert new.outputs[0] is p and p.producer() is new
    remove_node(g, r.producer())
    assert g.outputs == [p]
    assert verify_model(model) == []
    data = np.arange(2 * 3 * 8 * 8, dtype=np.float32).reshape(2, 3, 8, 8)
    out = run_model(model, {"x": data})["pool"]
    np.testing.assert_allclose(out, data.reshape(2, 3, 4, 2, 4, 2).mean(axis=(3, 5)))


def test_verifier_reports_every_problem_at_once() -> None:
    g = Graph("broken")
    x = g.add_input("x", TensorType("float32", (1, 4)))
    w = g.add_constant("w", np.ones((4, 2), np.float32))
    y = g.add("Dense", x, w, name="fc")
    g.outputs.append(y)
    # three independent problems
    y.type = TensorType("float32", (1, 3))
    g.constants.append(Value("x", TensorType("float32", (1,)), const=np.ones(1, np.float32)))
    stray = Value("ghost", TensorType("float32", (1, 2)))
    g.nodes.append(Node.create("Relu", [stray], [Value("r", TensorType("float32", (1, 2)))], {}, "relu"))
    problems = verify_model(Model(g))
    text = "\n".join(problems)
    assert "declared float32[1,3], inferred float32[1,2]" in text
    assert "'x' defined twice" in text
    assert "'ghost' is not defined" in text
    assert len(problems) >= 3


def test_verifier_catches_bad_annotations_and_order() -> None:
    g = Graph("g")
    x = g.add_input("x", TensorType("float32", (1, 4)))
    a = g.add("Relu", x, name="a")
    b = g.add("Relu", a, name="b")
    g.outputs.append(b)
    a.quant = Sign()
    x.quant = Affine((0.1, 0.2), (0, 0), "int8", axis=1)
    g.nodes.reverse()
    text = "\n".join(verify_model(Model(g)))
    assert "SIGN is for parameters only" in text
    assert "2 scales for axis of size 4" in text
    assert "not in topological order" in text
    g.sort()
    assert [n.name for n in g.nodes] == ["a", "b"]


def test_schema_checks_attributes_and_shapes() -> None:
    g = Graph("g")
    x = g.add_input("x", TensorType("float32", (1, 3, 8, 8)))
    w = g.add_constant("w", np.ones((4, 2, 3, 3), np.float32))
    with pytest.raises(InvalidInputError, match="input channels 3"):
        g.add("Conv", x, w)
    with pytest.raises(InvalidInputError, match="unknown attribute 'bogus'"):
        g.add("Relu", x, bogus=1)
    with pytest.raises(InvalidInputError, match="missing required attribute 'kernel'"):
        g.add("MaxPool", x)


def test_text_round_trip_keeps_annotations_and_symbols() -> None:
    g = Graph("annotated model")
    x = g.add_input("in:put", TensorType("float32", ("N", 4)))
    w = g.add_constant("fc/W", np.arange(8, dtype=np.float32).reshape(4, 2))
    w.quant = FixedPoint(8, 5)
    y = g.add("Dense", x, w, name="fc")
    y.quant = Affine((0.05,), (3,), "uint8")
    parts = g.add_node("Split", [y], {"axis": 1, "split": [1, 1]}, name="split").outputs
    g.outputs.extend(parts)
    model = Model(g, metadata={"producer": "test"})
    text = print_model(model)
    again = parse_model(text)
    assert print_model(again) == text
    assert again.graph.constants[0].quant == FixedPoint(8, 5)
    assert again.graph.inputs[0].type.shape == ("N", 4)
    elided = print_model(model, elide_above=4)
    assert 'elided "' in elided
    assert print_model(parse_model(elided), elide_above=4) == elided


def test_fixed_point_store_rule_survives_the_text_form_and_simulation() -> None:
    """The rounding of a truncating target's activations is part of the type: a dumped and
    re-parsed model simulates exactly like the original."""
    from qcc.sim import run_model

    g = Graph("trunc")
    x = g.add_input("x", TensorType("float32", (1, 8)))
    y = g.add("Relu", x, name="relu")
    y.quant = FixedPoint(8, 2, "trunc")
    g.outputs.append(y)
    model = Model(g)
    text = print_model(model)
    assert "fixed(8,2,trunc)" in text
    again = parse_model(text)
    assert again.graph.outputs[0].quant.rounding == "trunc"  # type: ignore[union-attr]
    feeds = {"x": np.linspace(0.1, 3.0, 8, dtype=np.float32).reshape(1, 8)}
    truncated = run_model(again, feeds, quantized=True)["relu"]
    np.testing.assert_array_equal(truncated, run_model(model, feeds, quantized=True)["relu"])
    np.testing.assert_array_equal(truncated, np.trunc(feeds["x"] * 4) / 4)
    half_even = Model(parse_model(text.replace(",trunc)", ")")).graph)
    assert not np.array_equal(run_model(half_even, feeds, quantized=True)["relu"], truncated)


def test_match_chains_requires_single_consumer() -> None:
    g = Graph("g")
    x = g.add_input("x", TensorType("float32", (1, 4)))
    a = g.add("Relu", x, name="a")
    b = g.add("Sigmoid", a, name="b")
    g.outputs.extend([b])
    assert [[n.name for n in c] for c in match_chains(g, ["Relu", "Sigmoid"])] == [["a", "b"]]
    g.add("Tanh", a, name="c")
    assert list(match_chains(g, ["Relu", "Sigmoid"])) == []
