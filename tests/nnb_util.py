"""Helpers for the .nnb backend tests: nnabla-built .nnp networks, nnabla_cli, nnablart."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

# nnabla-c-runtime's `nnablart` is never built by qcc; point QCC_NNABLART at a build (or put it
# on PATH) to check the files against the real runtime. Tests needing it skip without it.
_DEFAULT_NNABLART = "/tmp/nnablart/build/src/nnablart/nnablart"


def nnablart() -> str | None:
    for candidate in (os.environ.get("QCC_NNABLART"), shutil.which("nnablart"), _DEFAULT_NNABLART):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def run_nnablart(binary: str, nnb: Path, inputs: list[np.ndarray], workdir: Path) -> list[bytes]:
    """`nnablart infer` once; raw output files in order (the caller knows their types)."""
    paths = []
    for i, array in enumerate(inputs):
        path = workdir / f"in{i}.bin"
        np.ascontiguousarray(array).tofile(path)
        paths.append(str(path))
    prefix = workdir / "out"
    run = subprocess.run([binary, "infer", str(nnb), *paths, str(prefix)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    outs = []
    i = 0
    while (workdir / f"out_{i}.bin").exists():
        outs.append((workdir / f"out_{i}.bin").read_bytes())
        (workdir / f"out_{i}.bin").unlink()
        i += 1
    return outs


# nnabla rebuilds its function table through YAML on every conversion (seconds each); one
# interpreter with the table cached runs a whole batch of nnabla_cli command lines.
_CLI_BATCH = """
import copy, functools, json, sys
import nnabla.utils.converter as conv
from nnabla.utils.cli.cli import main
info = functools.lru_cache(maxsize=None)(conv.get_function_info)
conv.get_function_info = lambda: copy.deepcopy(info())
for argv in json.loads(sys.argv[1]):
    sys.argv = ["nnabla_cli", *argv]
    main()
"""


def nnabla_cli(*commands: list[str]) -> None:
    run = subprocess.run([sys.executable, "-c", _CLI_BATCH, json.dumps(commands)], capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def _save(path: Path, x: object, y: object) -> None:
    from nnabla.utils.save import save

    save(str(path), {
        "networks": [{"name": "net", "batch_size": 1, "outputs": {"y": y}, "names": {"x": x}}],
        "executors": [{"name": "runtime", "network": "net", "data": ["x"], "output": ["y"]}],
    })  # fmt: skip


def build_nnp_models(directory: Path) -> list[str]:
    """mlp, cnn, a residual/branching net (nnabla's expander reorders its functions) and one of
    each argument kind; random weights, BatchNorm statistics away from the identity."""
    import nnabla as nn
    import nnabla.functions as F
    import nnabla.parametric_functions as PF

    rng = np.random.RandomState(0)

    def randomize() -> None:
        for name, v in nn.get_parameters(grad_only=False).items():
            v.d = rng.uniform(0.5, 1.5, v.shape) if name.endswith("/var") else rng.randn(*v.shape) * 0.4

    def block(h: object, name: str, channels: int) -> object:
        h = PF.convolution(h, channels, (3, 3), pad=(1, 1), with_bias=False, name=f"{name}/conv")
        return F.relu(PF.batch_normalization(h, batch_stat=False, name=f"{name}/bn"))

    nets = {}
    nn.clear_parameters()
    x = nn.Variable((1, 8))
    nets["mlp"] = (x, PF.affine(F.relu(PF.affine(x, 16, name="fc1")), 4, name="fc2"))
    randomize()
    _save(directory / "mlp.nnp", *nets["mlp"])

    nn.clear_parameters()
    x = nn.Variable((1, 3, 8, 8))
    h = F.max_pooling(F.relu(PF.convolution(x, 4, (3, 3), pad=(1, 1), name="conv1")), (2, 2))
    nets["cnn"] = (x, PF.affine(h, 5, name="fc"))
    randomize()
    _save(directory / "cnn.nnp", *nets["cnn"])

    nn.clear_parameters()
    x = nn.Variable((1, 3, 8, 8))
    h = block(x, "c1", 8)
    r = PF.batch_normalization(PF.convolution(block(h, "r1", 8), 8, (3, 3), pad=(1, 1), with_bias=False,
                                              name="r2/conv"), batch_stat=False, name="r2/bn")
    h = F.relu(F.add2(r, h))
    side = PF.convolution(h, 4, (1, 1), name="side")
    h = F.concatenate(F.relu(side), block(h, "main", 4), axis=1)
    h = F.average_pooling(F.max_pooling(h, (2, 2)), (2, 2))
    nets["resnet"] = (x, F.softmax(PF.affine(h, 10, name="fc"), axis=1))
    randomize()
    _save(directory / "resnet.nnp", *nets["resnet"])

    nn.clear_parameters()
    x = nn.Variable((1, 3, 6, 6))
    h = PF.convolution(x, 4, (3, 3), pad=(1, 1), name="c1")
    h = PF.batch_normalization(h, batch_stat=False, name="bn")
    h = F.pad(h, (1, 1, 1, 1), mode="constant", constant_value=0.25)
    h = F.average_pooling(h, (2, 2), including_pad=False)
    h = F.concatenate(F.mul_scalar(h, 0.5), F.add_scalar(h, -1.25), axis=1)
    h = F.reshape(F.transpose(h, (0, 2, 3, 1)), (1, -1))
    nets["ks"] = (x, F.softmax(F.add2(h, h), axis=1))
    randomize()
    _save(directory / "ks.nnp", *nets["ks"])
    return list(nets)


def fixed_settings(template: Path, out: Path, bits: int = 16, position: int = 8) -> None:
    """Every variable FIXED<bits>: weights with nnabla's automatic position, the rest at one
    position (so biases sit at their outputs' and Add2 inputs share one, as the runtime needs)."""
    import yaml

    settings = yaml.safe_load(template.read_text())
    for name in settings["variables"]:
        auto = name.endswith("/W")
        settings["variables"][name] = f"FIXED{bits}" if auto else f"FIXED{bits}_{position}"
    out.write_text(yaml.safe_dump(settings))
