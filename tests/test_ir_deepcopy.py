"""A deep copy of a model (what --eval keeps of the float model) is independent of the original
and works at any depth: the default copy followed producers and use-lists recursively and
overflowed Python's recursion limit on a ViT-sized graph."""

from __future__ import annotations

import copy

import numpy as np

import qcc
from qcc.ir import Graph, Model, TensorType
from qcc.ir.verify import verify_model


def test_deep_graph_copies_independently() -> None:
    g = Graph("deep")
    x = g.add_input("x", TensorType("float32", ("N", 4)))
    h = g.add("Mul", x, g.add_constant("two", np.array([2.0], np.float32)), name="scale")
    for i in range(3000):
        h = g.add("Relu", h, name=f"relu{i}")
    g.outputs = [h]
    model = Model(g, metadata={"source": "test"})
    twin = copy.deepcopy(model)
    assert verify_model(twin) == []
    assert [n.name for n in twin.graph.nodes] == [n.name for n in model.graph.nodes]
    assert twin.graph.nodes[1].inputs[0] is twin.graph.nodes[0].outputs[0]
    assert twin.graph.nodes[1].inputs[0] is not model.graph.nodes[0].outputs[0]
    twin.graph.constants[0].const[0] = 3.0
    assert model.graph.constants[0].const[0] == 2.0
    feeds = {"x": np.ones((2, 4), np.float32)}
    assert qcc.run(twin, feeds)["relu2999"][0, 0] == 3.0 and qcc.run(model, feeds)["relu2999"][0, 0] == 2.0
