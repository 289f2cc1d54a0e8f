"""An .nnp file in nnabla (NnpLoader, the network's forward)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from qcc.errors import InvalidInputError
from qcc.runtimes.base import FLOAT, Runtime, Tolerance


class NnablaRuntime(Runtime):
    """nnabla's own forward of one network of an .nnp (the first, unless `network`)."""

    def __init__(self, path: str | os.PathLike[str], network: str | None = None, tolerance: Tolerance = FLOAT) -> None:
        import nnabla
        from nnabla.utils.nnp_graph import NnpLoader

        self.path = os.fspath(path)
        self.loader = NnpLoader(self.path)
        names = self.loader.get_network_names()
        if network is not None and network not in names:
            raise InvalidInputError(f"{self.path}: no network {network!r} (networks: {', '.join(names)})")
        self.network = network or names[0]
        net = self.loader.get_network(self.network, batch_size=1)
        self.inputs = tuple(net.inputs)
        self.outputs = tuple(net.outputs)
        self.batch = None
        self.tolerance = tolerance
        self.name = f"nnabla {nnabla.__version__} (network {self.network!r})"
        self._nets: dict[int, Any] = {1: net}

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        count = len(next(iter(feeds.values())))
        net = self._nets.get(count)
        if net is None:
            net = self._nets[count] = self.loader.get_network(self.network, batch_size=count)
        for name, var in net.inputs.items():
            var.d = feeds[name]
        outs = list(net.outputs.values())
        import nnabla as nn

        nn.forward_all(outs, clear_buffer=True)
        return {name: np.array(var.d, copy=True) for name, var in net.outputs.items()}
