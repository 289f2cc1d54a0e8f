"""Issue 20, critical: nothing is read from outside the model, wherever the model says to read it.

Each hostile file is built here. A secret lies beside the model's folder (and in the working
directory); every way ONNX and HDF5 can point at another file must be refused with exit 3 naming
the tensor, and the secret's bytes must never reach an output.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import qcc
from qcc.errors import InvalidInputError
from tests.cli_util import ROOT

SECRET = np.arange(16, dtype=np.float32) * 1000 + 7  # distinctive bytes


def _external(name: str, location: str, dims: tuple[int, ...] = (16,), offset: int | None = None) -> TensorProto:
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(dims))
    tensor.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "length": str(4 * int(np.prod(dims)))}
    if offset is not None:
        entries["offset"] = str(offset)
    for key, value in entries.items():
        tensor.external_data.add(key=key, value=value)
    return tensor


def _add_model(const_node: onnx.NodeProto | None = None, initializers: list[TensorProto] = (),  # type: ignore[assignment]
               extra_nodes: list[onnx.NodeProto] = (), sparse: list[onnx.SparseTensorProto] = ()) -> onnx.ModelProto:  # type: ignore[assignment]
    nodes = ([const_node] if const_node is not None else []) + list(extra_nodes)
    nodes.append(helper.make_node("Add", ["x", "w"], ["y"], name="add"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])],
                              initializer=list(initializers), sparse_initializer=list(sparse))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture()
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp/secrets/key (outside), tmp/model/ (the model's folder); the working directory is tmp."""
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "key").write_bytes(SECRET.tobytes())
    (tmp_path / "model").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _save(layout: Path, model: onnx.ModelProto) -> Path:
    path = layout / "model" / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _refused(path: Path, *needles: str) -> str:
    with pytest.raises(InvalidInputError) as info:
        qcc.load(path)
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    return message


CONSTANT_CASES = {
    # the campaign's case: resolved against the current directory today
    "constant-cwd-relative": lambda: helper.make_node("Constant", [], ["w"], name="c",
                                                      value=_external("cv", "secrets/key")),
    "constant-dotdot": lambda: helper.make_node("Constant", [], ["w"], name="c", value=_external("cv", "../secrets/key")),
    "constant-absolute": lambda: helper.make_node("Constant", [], ["w"], name="c",
                                                  value=_external("cv", "/etc/hostname")),
}


@pytest.mark.parametrize("case", sorted(CONSTANT_CASES))
def test_constant_attribute_external_data_is_refused(layout: Path, case: str) -> None:
    path = _save(layout, _add_model(CONSTANT_CASES[case]()))
    _refused(path, "'c'", "Constant")


def test_initializer_external_data_outside_the_folder_is_refused(layout: Path) -> None:
    path = _save(layout, _add_model(initializers=[_external("w", "../secrets/key")]))
    _refused(path, "initializer 'w'", "outside the model's folder")


def test_symlink_out_of_the_folder_is_refused(layout: Path) -> None:
    os.symlink(layout / "secrets" / "key", layout / "model" / "weights.bin")
    path = _save(layout, _add_model(initializers=[_external("w", "weights.bin")]))
    _refused(path, "initializer 'w'", "outside")


def test_constant_of_shape_value_external_is_refused(layout: Path) -> None:
    shape = numpy_helper.from_array(np.array([16], np.int64), "shape")
    node = helper.make_node("ConstantOfShape", ["shape"], ["w"], name="cos", value=_external("v", "../secrets/key", (1,)))
    path = _save(layout, _add_model(initializers=[shape], extra_nodes=[node]))
    _refused(path, "'cos'", "ConstantOfShape")


def test_subgraph_tensor_external_is_refused(layout: Path) -> None:
    inner = helper.make_graph([helper.make_node("Constant", [], ["t"], name="inner_c",
                                                value=_external("iv", "../secrets/key"))],
                              "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [16])])
    cond = numpy_helper.from_array(np.array(True), "cond")
    node = helper.make_node("If", ["cond"], ["w"], name="if", then_branch=inner, else_branch=inner)
    path = _save(layout, _add_model(initializers=[cond], extra_nodes=[node]))
    _refused(path, "inner_c", "outside")


def test_sparse_initializer_external_is_refused(layout: Path) -> None:
    values = _external("w", "../secrets/key", (4,))
    indices = numpy_helper.from_array(np.array([0, 1, 2, 3], np.int64), "w_idx")
    sparse = helper.make_sparse_tensor(values, indices, [16])
    path = _save(layout, _add_model(sparse=[sparse]))
    _refused(path, "sparse initializer", "outside")


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_external_data_that_is_not_a_regular_file_is_refused(layout: Path, special: str) -> None:
    link = layout / "model" / "weights.bin"
    if special == "fifo":
        os.mkfifo(link)  # opening it would block a reader waiting for a writer
    else:
        os.symlink(special, link)
    path = _save(layout, _add_model(initializers=[_external("w", "weights.bin")]))
    _refused(path, "initializer 'w'")


def test_external_data_beyond_the_file_or_limit_is_refused_before_reading(layout: Path) -> None:
    (layout / "model" / "weights.bin").write_bytes(SECRET.tobytes())
    path = _save(layout, _add_model(initializers=[_external("w", "weights.bin", offset=32)]))
    _refused(path, "initializer 'w'", "outside the file")
    huge = _external("w", "weights.bin", dims=(1 << 20, 1 << 12))
    path = _save(layout, _add_model(initializers=[huge]))
    with _limit(1 << 20):
        _refused(path, "'w'", "limit")


class _limit:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def __enter__(self) -> None:
        from qcc import limits

        self.saved = limits.current()
        limits.configure(max_parameter_bytes=self.nbytes)

    def __exit__(self, *exc: object) -> None:
        from qcc import limits

        limits._current = self.saved


def test_external_data_inside_the_folder_still_loads_and_matches_onnxruntime(layout: Path) -> None:
    import onnxruntime as ort

    weights = np.linspace(-3, 3, 16, dtype=np.float32)
    (layout / "model" / "data").mkdir()
    (layout / "model" / "data" / "w.bin").write_bytes(b"\0" * 8 + weights.tobytes())
    path = _save(layout, _add_model(initializers=[_external("w", "data/w.bin", offset=8)]))
    x = np.arange(16, dtype=np.float32)
    model = qcc.load(path)
    got = qcc.run(model, {"x": x})
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(got["y"], sess.run(None, {"x": x})[0])


def test_cli_exit_code_3_and_no_output_for_a_cwd_relative_constant(layout: Path) -> None:
    path = _save(layout, _add_model(CONSTANT_CASES["constant-cwd-relative"]()))
    out = layout / "out.onnx"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "qcc", "compile", str(path), "-o", str(out)], cwd=layout,
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 3, proc.stderr
    assert "node 'c' (Constant)" in proc.stderr
    assert not out.exists()


# ----------------------------------------------------------------------------- .nnp HDF5
def _nnp_with_h5(layout: Path, build: object) -> Path:
    """An .nnp with one Affine layer whose parameter .h5 is built by `build(h5file)`."""
    import h5py

    nntxt = """
global_config { default_context { backends: "cpu:float" array_class: "CpuCachedArray" } }
network { name: "net" batch_size: 1
  variable { name: "x" type: "Buffer" shape { dim: 1 dim: 4 } }
  variable { name: "fc/affine/W" type: "Parameter" shape { dim: 4 dim: 2 } }
  variable { name: "fc/affine/b" type: "Parameter" shape { dim: 2 } }
  variable { name: "y" type: "Buffer" shape { dim: 1 dim: 2 } }
  function { name: "fc" type: "Affine" input: "x" input: "fc/affine/W" input: "fc/affine/b" output: "y"
             affine_param { base_axis: 1 } }
}
executor { name: "runtime" network_name: "net" data_variable { variable_name: "x" data_name: "x" }
           output_variable { variable_name: "y" data_name: "y" } }
"""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as handle:
        handle.create_dataset("fc/affine/W", data=np.ones((4, 2), np.float32)).attrs["index"] = 0
        build(handle)  # type: ignore[operator]
    path = layout / "model" / "m.nnp"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("nnp_version.txt", "0.1\n")
        zf.writestr("network.nntxt", nntxt)
        zf.writestr("parameter.h5", buffer.getvalue())
    return path


def test_nnp_hdf5_external_storage_is_refused(layout: Path) -> None:
    pytest.importorskip("nnabla")

    def build(handle: object) -> None:
        dset = handle.create_dataset("fc/affine/b", shape=(2,), dtype="f4",  # type: ignore[attr-defined]
                                     external=[("secrets/key", 0, 8)])
        dset.attrs["index"] = 1

    path = _nnp_with_h5(layout, build)
    _refused(path, "fc/affine/b", "external file")


def test_nnp_hdf5_external_link_is_refused(layout: Path) -> None:
    pytest.importorskip("nnabla")
    import h5py

    def build(handle: object) -> None:
        handle["fc/affine/b"] = h5py.ExternalLink("../secrets/other.h5", "/b")  # type: ignore[index]

    path = _nnp_with_h5(layout, build)
    _refused(path, "fc/affine/b", "ExternalLink")


def test_nnp_hdf5_virtual_dataset_is_refused(layout: Path) -> None:
    pytest.importorskip("nnabla")
    import h5py

    source = layout / "secrets" / "v.h5"
    with h5py.File(source, "w") as handle:
        handle.create_dataset("b", data=SECRET[:2])

    def build(handle: object) -> None:
        vlayout = h5py.VirtualLayout(shape=(2,), dtype="f4")
        vlayout[:] = h5py.VirtualSource(str(source), "b", shape=(2,))
        handle.create_virtual_dataset("fc/affine/b", vlayout).attrs["index"] = 1  # type: ignore[attr-defined]

    path = _nnp_with_h5(layout, build)
    _refused(path, "fc/affine/b", "virtual")


def test_nnp_plain_parameters_still_load(layout: Path) -> None:
    pytest.importorskip("nnabla")

    def build(handle: object) -> None:
        handle.create_dataset("fc/affine/b", data=np.array([1.0, 2.0], np.float32)).attrs["index"] = 1  # type: ignore[attr-defined]

    model = qcc.load(_nnp_with_h5(layout, build))
    y = qcc.run(model, {"x": np.ones((1, 4), np.float32)})
    np.testing.assert_allclose(y["y"], [[5.0, 6.0]])


# ----------------------------------------------------------------------------- qcc run / qcc eval
def _run_cli(layout: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "qcc", *map(str, args)], cwd=layout, capture_output=True, text=True,
                          env=env, timeout=300)


def test_qcc_run_and_eval_give_a_runtime_only_what_qcc_s_readers_accept(layout: Path) -> None:
    """onnxruntime and nnabla would read an external reference or an HDF5 external dataset
    anywhere on disk, and a corrupt file crashed them (exit 70): the same checks as compile."""
    pytest.importorskip("nnabla")
    np.savez(layout / "x.npz", x=np.ones(16, np.float32))  # the models take one [16] vector
    outside = _save(layout, _add_model(initializers=[_external("w", "../secrets/key")]))
    constant = layout / "model" / "c.onnx"
    constant.write_bytes(_add_model(CONSTANT_CASES["constant-cwd-relative"]()).SerializeToString())
    truncated = layout / "model" / "t.onnx"
    truncated.write_bytes(_add_model(initializers=[numpy_helper.from_array(SECRET, "w")]).SerializeToString()[:60])

    def build(handle: object) -> None:
        handle.create_dataset("fc/affine/b", shape=(2,), dtype="f4",  # type: ignore[attr-defined]
                              external=[("secrets/key", 0, 8)]).attrs["index"] = 1

    nnp = _nnp_with_h5(layout, build)
    np.savez(layout / "x4.npz", x=np.ones((1, 4), np.float32))
    os.mkfifo(layout / "model" / "f.nnb")
    cases = [(("run", outside, "x.npz", "-o", "o.npz"), "initializer 'w'"),
             (("eval", constant, "x.npz"), "node 'c' (Constant)"),
             (("run", truncated, "x.npz", "-o", "o.npz"), "not a valid ONNX model"),
             (("run", nnp, "x4.npz", "-o", "o.npz"), "external file"),
             (("run", layout / "model" / "f.nnb", "x4.npz", "-o", "o.npz"), "not a regular file")]
    for args, needle in cases:
        proc = _run_cli(layout, *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 3 and len(lines) == 1 and needle in lines[0], (args, proc.stderr)
    assert not (layout / "o.npz").exists()
