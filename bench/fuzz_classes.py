"""Case generators for the defect classes of issue 20, plugged into bench/fuzz.py as readers.

| reader | what a case is | a finding |
|---|---|---|
| external | an ONNX model whose tensors (initializer, Constant/ConstantOfShape value, If subgraph, sparse initializer, function body, training graph) keep their bytes in another file: `..`, absolute, cwd-relative, a symlink out, /dev/zero, a FIFO, a directory, odd offsets and lengths | the secret's bytes in the loaded model (`outside`), a hang on the secret FIFO |
| hdf5 | an .nnp whose parameter.h5 uses external storage, external links, virtual datasets, soft links, huge or many datasets, odd dtypes, deep groups | as above |
| special | a model (.onnx/.nnp/.pt2), data (.npz), settings (.yaml) or .nnb path that is a symlink to /dev/zero or /dev/urandom, a FIFO, a directory, a socket, a dangling or looping symlink | a hang, a MemoryError |
| dtype | an ONNX initializer of every element type, in raw_data or typed fields, right or wrong sizes, random bits, through Cast -> Add | qcc's values differ from onnxruntime's (`wrong`) |
| bomb | folding bombs (broadcast ops, MatMul, Gather, Pad, Expand, Tile, Range, ConvTranspose, Concat, chains of ConstantOfShape) and aggregate bombs (zip members under the ratio floor, many large HDF5 datasets) | a MemoryError under the worker's cap |
| outputs | a compile whose -o/--report/--dump-ir is a user's directory or file, the model, a folder holding an input, another output, a FIFO, `main` for target c, with or without --force | a user's file changed or lost (`lost`) |

Every case is a `Case`: files to create in the case folder (bytes, a symlink, a FIFO, a folder,
a socket) and which of them the reader opens. The worker's home holds the secret the cases try to
reach (`secret.bin` beside the case folder and as `secrets/key` in the working directory, and a
FIFO `secret.fifo` that blocks whoever opens it).
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import shutil
import socket
import stat
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"
# finite float32 / bf16 / fp16 at every alignment (bytes 0x21..0x33), so a constant made of them
# passes the verifier's NaN check and reaches the model, where `find_secret` sees it
MARKER = b"!#%&()*+,-./0123"
SECRET = MARKER * (16384 // len(MARKER) * 16)  # 256 KiB
# paths that reach the worker's secret from the case folder, the working directory or anywhere
SECRET_LOCATIONS = ("../secret.bin", "secrets/key", "/proc/self/cwd/../secret.bin", "link_out.bin",
                    "sub/../../secret.bin", "./../secret.bin", "..\\secret.bin", "../secret.fifo")


class Finding(Exception):
    """A case outcome that is not an exception of qcc's: `outside`, `wrong` or `lost`."""

    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome


Entry = bytes | tuple[str, ...]  # bytes: a file; ("symlink", target), ("fifo",), ("dir",), ("socket",)


@attrs.frozen
class Case:
    files: tuple[tuple[str, Entry], ...]
    main: str
    command: tuple[tuple[str, Any], ...] = ()  # the outputs reader: compile options


def setup_home(home: str, cwd: str) -> None:
    """The secrets a worker's cases try to reach (created once per worker)."""
    Path(home, "secret.bin").write_bytes(SECRET)
    Path(cwd, "secrets").mkdir(parents=True, exist_ok=True)
    Path(cwd, "secrets", "key").write_bytes(SECRET)
    fifo = Path(home, "secret.fifo")
    if not fifo.exists():
        os.mkfifo(fifo)


def materialize(case: Case, folder: str) -> set[str]:
    """Create the case's files in `folder`; returns the top-level names it created."""
    for name, entry in case.files:
        path = Path(folder, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(entry, bytes):
            path.write_bytes(entry)
        elif entry[0] == "symlink":
            os.symlink(entry[1], path)
        elif entry[0] == "fifo":
            os.mkfifo(path)
        elif entry[0] == "dir":
            path.mkdir(exist_ok=True)
        elif entry[0] == "socket":
            sock = socket.socket(socket.AF_UNIX)
            try:
                sock.bind(str(path))
            except OSError:  # the path is too long for a socket: a FIFO stands in for it
                os.mkfifo(path)
            finally:
                sock.close()
    return {name.split("/")[0] for name, _ in case.files}


def find_secret(model: Any) -> str | None:
    """The name of a constant holding the secret's bytes (a read outside the model), if any."""
    for value in model.graph.values():
        if value.const is not None and MARKER[:8] in np.ascontiguousarray(value.const).tobytes():
            return str(value.name)
    return None


# ----------------------------------------------------------------------------- external
def _ext_tensor(name: str, location: str, dims: list[int], rng: random.Random) -> Any:
    from onnx import TensorProto

    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims)
    tensor.data_location = TensorProto.EXTERNAL
    entries = [("location", location)]
    nbytes = 4 * int(np.prod(dims))
    extra = rng.choice(((), (("length", str(nbytes)),), (("offset", str(rng.choice((0, 4, 16, 4096)))),),
                        (("offset", "-4"),), (("length", "99999999999"),), (("offset", "1e3"),),
                        (("offset", str(2**63)),), (("length", str(nbytes + 4)),), (("checksum", "x"),)))
    for key, value in (*entries, *extra):
        tensor.external_data.add(key=key, value=value)
    return tensor


def external_case(rng: random.Random, seeds: list[bytes]) -> Case:
    from onnx import TensorProto, helper, numpy_helper

    location = rng.choice((*SECRET_LOCATIONS, "zero.bin", "fifo.bin", "folder", "ok.bin", "ok.bin", "missing.bin",
                           "", ".", "case.onnx", "ok.bin\x00../secret.bin", "/dev/zero", "/dev/urandom",
                           "/proc/self/environ", "socket.bin"))
    files: dict[str, Entry] = {
        "ok.bin": np.arange(64, dtype=np.float32).tobytes(), "link_out.bin": ("symlink", "../secret.bin"),
        "zero.bin": ("symlink", "/dev/zero"), "fifo.bin": ("fifo",), "folder": ("dir",), "sub": ("dir",),
        "socket.bin": ("socket",)}
    where = rng.choice(("initializer", "constant", "constant_of_shape", "subgraph", "sparse", "function",
                        "training"))
    tensor = _ext_tensor("w_ext", location, [16], rng)
    nodes: list[Any] = []
    inits: list[Any] = []
    sparse: list[Any] = []
    functions: list[Any] = []
    training: list[Any] = []
    if where == "initializer":
        tensor.name = "w"
        inits.append(tensor)
    elif where == "constant":
        nodes.append(helper.make_node("Constant", [], ["w"], name="c", value=tensor))
    elif where == "constant_of_shape":
        inits.append(numpy_helper.from_array(np.array([16], np.int64), "shape"))
        nodes.append(helper.make_node("ConstantOfShape", ["shape"], ["w"], name="cos",
                                      value=_ext_tensor("v", location, [1], rng)))
    elif where == "subgraph":
        branch = helper.make_graph([helper.make_node("Constant", [], ["t"], name="inner", value=tensor)], "b", [],
                                   [helper.make_tensor_value_info("t", TensorProto.FLOAT, [16])])
        inits.append(numpy_helper.from_array(np.array(True), "cond"))
        nodes.append(helper.make_node("If", ["cond"], ["w"], name="if", then_branch=branch, else_branch=branch))
    elif where == "sparse":
        values = _ext_tensor("w", location, [4], rng)
        indices = numpy_helper.from_array(np.array([0, 3, 7, 15], np.int64), "w_idx")
        sparse.append(helper.make_sparse_tensor(values, indices, [16]))
    elif where == "function":
        body = helper.make_node("Constant", [], ["fo"], name="fc", value=tensor)
        functions.append(helper.make_function("local", "Fn", [], ["fo"], [body], [helper.make_opsetid("", 17)]))
        nodes.append(helper.make_node("Fn", [], ["w"], name="call", domain="local"))
    else:
        inits.append(numpy_helper.from_array(np.ones(16, np.float32), "w"))
        init_graph = helper.make_graph([], "init", [], [], initializer=[tensor])
        training.append(init_graph)
    nodes.append(helper.make_node("Add", ["x", "w"], ["y"], name="add"))
    graph = helper.make_graph(nodes, "ext", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])], initializer=inits,
                              sparse_initializer=sparse)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                              functions=functions)
    for init_graph in training:
        model.training_info.add().initialization.CopyFrom(init_graph)
    files["case.onnx"] = model.SerializeToString()
    return Case(tuple(files.items()), "case.onnx")


def read_external(path: str) -> None:
    import qcc.driver

    model = qcc.driver.load(path)
    leaked = find_secret(model)
    if leaked is not None:
        raise Finding("outside", f"constant {leaked!r} holds the bytes of a file outside the model's folder")


# ----------------------------------------------------------------------------- hdf5
def _h5_member(rng: random.Random, params: dict[str, np.ndarray]) -> tuple[bytes, str]:
    import h5py

    attack = rng.choice(("external", "external", "external_link", "virtual", "soft_link", "huge", "many",
                         "dtype", "deep", "cycle", "attrs", "plain"))
    names = list(params)
    victim = rng.choice(names)
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as handle:
        for index, (name, array) in enumerate(params.items()):
            if name == victim and attack in ("external", "external_link", "virtual", "soft_link", "dtype"):
                continue
            dataset = handle.create_dataset(name, data=array)
            dataset.attrs["need_grad"] = False
            dataset.attrs["index"] = index
        shape, index = params[victim].shape, names.index(victim)
        if attack == "external":
            location = rng.choice((*SECRET_LOCATIONS, "/dev/zero", "/dev/urandom", "../secret.fifo"))
            dataset = handle.create_dataset(victim, shape=shape, dtype="f4",
                                            external=[(location, rng.choice((0, 16)), int(np.prod(shape)) * 4)])
            dataset.attrs["index"] = index
        elif attack == "external_link":
            handle[victim] = h5py.ExternalLink(rng.choice(("../secret.fifo", "/proc/self/cwd/../secret.fifo")), "/x")
        elif attack == "virtual":
            layout = h5py.VirtualLayout(shape=shape, dtype="f4")
            layout[...] = h5py.VirtualSource(rng.choice(("../secret.fifo", "/proc/self/cwd/../secret.fifo")), "x",
                                             shape=shape)
            handle.create_virtual_dataset(victim, layout, fillvalue=0)
        elif attack == "soft_link":
            handle[victim] = h5py.SoftLink(f"/{rng.choice(names)}")
        elif attack == "huge":
            handle.create_dataset("bomb", shape=(rng.choice((2**31, 2**34, 2**40)),), dtype="f4",
                                  chunks=(2**20,), compression="gzip")
        elif attack == "many":  # each under the limit, together over it (the running total)
            for i in range(rng.choice((8, 40))):
                handle.create_dataset(f"many{i}", shape=(2**26,), dtype="f4", chunks=(2**20,), compression="gzip")
        elif attack == "dtype":
            kind = rng.choice(("str", "compound", "ref", "vlen", "enum", "f2", "c8", "bool"))
            data: Any = {
                "str": np.array([b"x"] * 4), "compound": np.zeros(4, dtype=[("a", "f4"), ("b", "i4")]),
                "f2": np.zeros(shape, np.float16), "c8": np.zeros(shape, np.complex64), "bool": np.zeros(shape, bool),
            }.get(kind)
            if kind == "ref":
                handle.create_dataset(victim, shape=(1,), dtype=h5py.ref_dtype)
            elif kind == "vlen":
                handle.create_dataset(victim, shape=(2,), dtype=h5py.vlen_dtype(np.float32))
            elif kind == "enum":
                handle.create_dataset(victim, shape=shape, dtype=h5py.enum_dtype({"a": 0, "b": 1}, basetype="i1"))
            else:
                handle.create_dataset(victim, data=data)
        elif attack == "deep":
            group = handle
            for level in range(rng.choice((100, 2000))):
                group = group.create_group(f"g{level}")
        elif attack == "cycle":
            group = handle.create_group("loop")
            group["back"] = handle["/"]
        elif attack == "attrs":
            handle[victim].attrs["index"] = rng.choice((np.array([1, 2]), "x", 2**62, -1))
    return buffer.getvalue(), attack


_NNP_PARAMS: dict[str, Any] = {}


def _nnp_parts(seeds: list[bytes]) -> tuple[dict[str, bytes], dict[str, np.ndarray]]:
    """The h5 seed's members and its parameters (read once per worker)."""
    if "parts" not in _NNP_PARAMS:
        import tempfile

        from qcc.formats.nnp_archive import read_nnp

        with zipfile.ZipFile(io.BytesIO(seeds[-1])) as zf:
            members = {info.filename: zf.read(info) for info in zf.infolist()}
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp, "seed.nnp")
            path.write_bytes(seeds[-1])
            params = read_nnp(path).params
        _NNP_PARAMS["parts"] = (members, params)
    return _NNP_PARAMS["parts"]  # type: ignore[no-any-return]


def hdf5_case(rng: random.Random, seeds: list[bytes]) -> Case:
    members, params = _nnp_parts(seeds)
    h5, _ = _h5_member(rng, params)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, h5 if name.endswith(".h5") else data)
    return Case((("case.nnp", out.getvalue()), ("link_out.bin", ("symlink", "../secret.bin")), ("sub", ("dir",))),
                "case.nnp")


read_hdf5 = read_external  # the same check: load, then look for the secret in the constants


# ----------------------------------------------------------------------------- special files
SPECIAL = (("symlink", "/dev/zero"), ("symlink", "/dev/urandom"), ("symlink", "/dev/null"), ("fifo",), ("dir",),
           ("socket",), ("symlink", "missing"), ("symlink", "loop_b"), ("symlink", "../secret.fifo"))


def special_case(rng: random.Random, seeds: list[bytes]) -> Case:
    ext = rng.choice((".onnx", ".nnp", ".nntxt", ".pt2", ".npz", ".yaml", ".nnb"))
    entry = rng.choice(SPECIAL)
    files: list[tuple[str, Entry]] = [(f"case{ext}", entry)]
    if entry == ("symlink", "loop_b"):
        files.append(("loop_b", ("symlink", f"case{ext}")))
    return Case(tuple(files), f"case{ext}")


def read_special(path: str) -> None:
    from bench import fuzz

    ext = os.path.splitext(path)[1]
    {".npz": fuzz.read_npz, ".yaml": fuzz.read_yaml, ".nnb": fuzz.read_nnb}.get(ext, fuzz.read_onnx)(path)


# ----------------------------------------------------------------------------- element types
def dtype_case(rng: random.Random, seeds: list[bytes]) -> Case:
    from onnx import TensorProto, helper

    code = rng.choice((*range(1, 24), 0, 24, 99))
    dims = rng.choice(([16], [4, 4], [], [0], [3, 5], [2, 2, 2]))
    count = int(np.prod(dims))
    tensor = TensorProto(name="w", data_type=code, dims=dims)
    storage = rng.choice(("raw", "raw", "typed", "raw_wrong", "typed_wrong"))
    width = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8, 15: 16, 16: 2,
             17: 1, 18: 1, 19: 1, 20: 1, 21: 1, 22: 1, 23: 1}.get(code, 4)
    nbytes = (count + 1) // 2 if code in (21, 22, 23) else count * width
    if storage.startswith("raw"):
        nbytes += rng.choice((-1, 1, 7)) if storage == "raw_wrong" else 0
        tensor.raw_data = rng.randbytes(max(nbytes, 0))
    else:
        n = count + (rng.choice((-1, 1)) if storage == "typed_wrong" else 0)
        n = max(n, 0)
        if code == 1:
            tensor.float_data.extend(rng.uniform(-1e3, 1e3) for _ in range(n))
        elif code in (11,):
            tensor.double_data.extend(rng.uniform(-1e3, 1e3) for _ in range(n))
        elif code in (7,):
            tensor.int64_data.extend(rng.randint(-2**40, 2**40) for _ in range(n))
        elif code in (12, 13):
            tensor.uint64_data.extend(rng.randint(0, 2**32) for _ in range(n))
        elif code in (8,):
            tensor.string_data.extend(b"s" for _ in range(n))
        else:  # int32_data holds every small integer and the bit patterns of 16/8/4-bit floats
            tensor.int32_data.extend(rng.choice((rng.randint(0, 255), rng.randint(-2**31, 2**31 - 1),
                                                 rng.randint(0, 65535))) for _ in range(n))
    nodes = [helper.make_node("Cast", ["w"], ["wf"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "wf"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "dt", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)], initializer=[tensor])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return Case((("case.onnx", model.SerializeToString()),), "case.onnx")


def read_dtype(path: str) -> None:
    """Load; when qcc accepts the tensor, its values must be onnxruntime's, bit for bit (Cast to float32
    and adding zeros are exact), NaN where onnxruntime has NaN."""
    import qcc
    import qcc.driver

    model = qcc.driver.load(path)
    try:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 4  # its refusals are not findings
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        x = np.zeros(session.get_inputs()[0].shape, np.float32)
        expected = session.run(None, {"x": x})[0]
    except Exception:  # onnxruntime refuses the file: nothing to compare with
        return
    got = qcc.run(model, {model.graph.inputs[0].name: x})[model.graph.outputs[0].name]
    if got.shape != expected.shape or not np.array_equal(got, expected, equal_nan=True):
        raise Finding("wrong", f"values differ from onnxruntime's: qcc {got.reshape(-1)[:4]}, "
                               f"onnxruntime {expected.reshape(-1)[:4]}")


# ----------------------------------------------------------------------------- bombs
_ZERO_STREAMS: dict[int, bytes] = {}


def _zeros_deflated(size: int) -> bytes:
    if size not in _ZERO_STREAMS:
        _ZERO_STREAMS[size] = zlib.compress(bytes(size), 9)[2:-4]  # raw deflate
    return _ZERO_STREAMS[size]


def zip_of_zeros(names: list[str], size: int, extra: dict[str, bytes]) -> bytes:
    """A zip whose `names` each inflate to `size` zero bytes, built without compressing them again."""
    stream = _zeros_deflated(size)
    crc = zlib.crc32(bytes(size))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in extra.items():
            zf.writestr(name, data)
        offsets = []
        for name in names:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            zf.writestr(info, stream, compress_type=zipfile.ZIP_STORED)
            info = zf.getinfo(name)
            info.compress_type, info.file_size, info.CRC = zipfile.ZIP_DEFLATED, size, crc
            offsets.append(info.header_offset)
    raw = bytearray(out.getvalue())
    for offset in offsets:  # the local headers too: method, crc, uncompressed size
        raw[offset + 8:offset + 10] = zipfile.ZIP_DEFLATED.to_bytes(2, "little")
        raw[offset + 14:offset + 18] = crc.to_bytes(4, "little")
        raw[offset + 22:offset + 26] = size.to_bytes(4, "little")
    return bytes(raw)


def _fold_bomb(rng: random.Random) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    # results from 256 MiB (under the campaign's limits: allowed) through 1-2 GiB (within the worker's
    # memory cap: a reader that allocates before checking gets them, and the peak shows it) to 64 GiB
    big = rng.choice((2**13, 2**14, 3 * 2**13, 2**16, 2**17))
    f32 = np.float32
    kind = rng.choice(("add", "where", "equal", "matmul", "gemm", "gather", "pad", "expand", "tile", "range",
                       "convtranspose", "conv_pads", "maxpool_pads", "concat", "constant_of_shape_chain", "sum",
                       "cast64"))
    inits: list[Any] = []
    nodes: list[Any] = []

    def init(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(array, name))
        return name

    if kind in ("add", "where", "equal", "sum"):
        a, b = init("a", np.ones((big, 1), f32)), init("b", np.ones((1, big), f32))
        op = {"add": "Add", "where": "Where", "equal": "Equal", "sum": "Sum"}[kind]
        ins = [init("c", np.ones((1, 1), bool)), a, b] if kind == "where" else [a, b]
        nodes.append(helper.make_node(op, ins, ["r"], name="bomb"))
    elif kind in ("matmul", "gemm"):
        nodes.append(helper.make_node("MatMul" if kind == "matmul" else "Gemm",
                                      [init("a", np.ones((big, 1), f32)), init("b", np.ones((1, big), f32))],
                                      ["r"], name="bomb"))
    elif kind == "gather":
        nodes.append(helper.make_node("Gather", [init("a", np.ones((1, big), f32)),
                                                 init("i", np.zeros(big, np.int64))], ["r"], name="bomb", axis=0))
    elif kind == "pad":
        nodes.append(helper.make_node("Pad", [init("a", np.ones((1, 1), f32)),
                                              init("p", np.array([0, 0, big, big], np.int64))], ["r"], name="bomb"))
    elif kind == "expand":
        nodes.append(helper.make_node("Expand", [init("a", np.ones(1, f32)),
                                                 init("s", np.array([big, big], np.int64))], ["r"], name="bomb"))
    elif kind == "tile":
        nodes.append(helper.make_node("Tile", [init("a", np.ones((1, 1), f32)),
                                               init("s", np.array([big, big], np.int64))], ["r"], name="bomb"))
    elif kind == "range":
        nodes.append(helper.make_node("Range", [init("s", np.array(0, f32)), init("l", np.array(2.0**34, f32)),
                                                init("d", np.array(rng.choice((1.0, 1e-30)), f32))], ["r"], name="bomb"))
    elif kind == "convtranspose":
        nodes.append(helper.make_node("ConvTranspose", [init("a", np.ones((1, 1, 3, 3), f32)),
                                                        init("w", np.ones((1, 1, 1, 1), f32))], ["r"], name="bomb",
                                      strides=[big, big]))
    elif kind == "conv_pads":
        nodes.append(helper.make_node("Conv", [init("a", np.ones((1, 1, 1, 1), f32)),
                                               init("w", np.ones((1, 1, 1, 1), f32))], ["r"], name="bomb",
                                      pads=[0, 0, big, big]))
    elif kind == "maxpool_pads":
        nodes.append(helper.make_node("MaxPool", [init("a", np.ones((1, 1, 1, 1), f32))], ["r"], name="bomb",
                                      kernel_shape=[1, 1], pads=[0, 0, big - 1, big - 1]))
    elif kind == "concat":
        nodes.append(helper.make_node("Concat", [init("a", np.ones(2**16, f32))] * rng.choice((4000, 20000)), ["r"],
                                      name="bomb", axis=0))
    elif kind == "cast64":
        nodes.append(helper.make_node("ConstantOfShape", [init("s", np.array([2**26], np.int64))], ["z"], name="z"))
        nodes.append(helper.make_node("Cast", ["z"], ["r"], name="bomb", to=TensorProto.DOUBLE))
    else:  # each under the limit, together over it: the model's running total
        shape = init("s", np.array([2**25], np.int64))
        for i in range(rng.choice((8, 40))):
            nodes.append(helper.make_node("ConstantOfShape", [shape], [f"z{i}"], name=f"z{i}"))
            nodes.append(helper.make_node("ReduceMax", [f"z{i}"], [f"m{i}"], name=f"m{i}", keepdims=0))
        nodes.append(helper.make_node("Sum", [f"m{i}" for i in range(8)], ["r"], name="bomb"))
    nodes.append(helper.make_node("ReduceSum", ["r"], ["rs"], name="rs", keepdims=0))
    nodes.append(helper.make_node("Cast", ["rs"], ["rf"], name="rf", to=TensorProto.FLOAT))
    nodes.append(helper.make_node("Add", ["x", "rf"], ["y"], name="use"))
    graph = helper.make_graph(nodes, "bomb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], initializer=inits)
    return bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())


def bomb_case(rng: random.Random, seeds: list[bytes]) -> Case:
    kind = rng.choice(("fold", "fold", "nnp_members", "nnp_h5", "npz_members"))
    if kind == "fold":
        return Case((("case.onnx", _fold_bomb(rng)),), "case.onnx")
    members, _ = _nnp_parts(seeds)
    if kind == "nnp_h5":
        import h5py

        h5 = io.BytesIO()
        with h5py.File(h5, "w") as handle:  # many datasets, each under the limits, together over them
            for i in range(rng.choice((12, 40))):
                handle.create_dataset(f"p{i}", shape=(2**25,), dtype="f4", chunks=(2**20,), compression="gzip")
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as zf:
            for name, data in members.items():
                zf.writestr(name, h5.getvalue() if name.endswith(".h5") else data)
        return Case((("case.nnp", out.getvalue()),), "case.nnp")
    size = 16 * 1024 * 1024 - rng.choice((1, 4096))  # just under the per-member ratio floor
    count = rng.choice((40, 200))
    if kind == "nnp_members":
        names = [f"parameter{i}.{rng.choice(('protobuf', 'h5', 'nntxt', 'bin'))}" for i in range(count)]
        return Case((("case.nnp", zip_of_zeros(names, size, members)),), "case.nnp")
    return Case((("case.npz", zip_of_zeros([f"x{i}.npy" for i in range(count)], size, {})),), "case.npz")


def read_bomb(path: str) -> None:
    from bench import fuzz

    (fuzz.read_npz if path.endswith(".npz") else fuzz.read_onnx)(path)


# ----------------------------------------------------------------------------- outputs
USER_FILES = {"user/notes.txt": b"the user's notes\n", "user/deep/data.bin": b"\x00\x01" * 64,
              "plain.txt": b"a user's file\n", "data/calib_copy.txt": b"keep me\n"}


def outputs_case(rng: random.Random, seeds: list[bytes]) -> Case:
    files: dict[str, Entry] = {"model.onnx": seeds[0], "calib.npz": seeds[1], "data/calib.npz": seeds[1],
                               "settings.yaml": b"variables: {}\n", "empty": ("dir",), "fifo": ("fifo",),
                               "link_to_plain": ("symlink", "plain.txt"), "qccdir/.qcc-output": b"x",
                               "qccdir/old.c": b"int old;\n", **USER_FILES}
    target, out = rng.choice((
        ("c", "user"), ("c", "plain.txt"), ("c", "main"), ("c", "MAIN"), ("c", "."), ("c", "data"), ("c", "empty"),
        ("c", "qccdir"), ("c", "new_c"), ("c", "fifo"), ("c", "link_to_plain"), ("c", "user/deep"),
        ("onnx", "model.onnx"), ("onnx", "user"), ("onnx", "fifo"), ("onnx", "link_to_plain"), ("onnx", "calib.npz"),
        ("onnx", "settings.yaml"), ("onnx", "plain.txt/x.onnx"), ("onnx", "new.onnx"), ("nnb", "model.onnx"),
        ("nnp", "user/notes.txt"), ("onnx", "empty"), ("onnx", "user/new.onnx"),
    ))
    options: dict[str, Any] = {"target": target, "out": out}
    extra = rng.random()
    if extra < 0.15:
        options["report"] = rng.choice(("user", "model.onnx", out, "report.json", "fifo", "plain.txt"))
    elif extra < 0.3:
        options["dump_ir"] = rng.choice(("plain.txt", "model.onnx", out, "dumps", "user"))
    elif extra < 0.4:
        options["eval"] = rng.choice(("calib.npz", "data/calib.npz"))
    elif extra < 0.5:
        options["settings"] = "settings.yaml"
    options["force"] = rng.random() < 0.3
    return Case(tuple(files.items()), "model.onnx", tuple(sorted(options.items())))


def _digest(path: Path) -> str | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return "link:" + os.readlink(path)
    if stat.S_ISREG(info.st_mode):
        return hashlib.sha256(path.read_bytes()).hexdigest()
    return "special" if not stat.S_ISDIR(info.st_mode) else "dir"


def _under(name: str, folder: str | None) -> bool:
    return folder is not None and (name == folder or name.startswith(f"{folder}/"))


def run_outputs(folder: str, case: Case) -> None:
    """Compile as the case says; then every file the user had must be as it was, except what the
    run was asked to replace: a file output, the report, a directory output that was qcc's,
    empty or --force'd. Inputs never change; a failed run changes nothing (IR dumps excepted)."""
    import qcc.driver

    try:
        from qcc.outputs import MARKER
    except ImportError:  # a qcc from before issue 20: replay the campaign against it
        MARKER = ".qcc-output"
    options = dict(case.command)
    out, force, target = options.pop("out"), options.get("force", False), options.pop("target")
    root = Path(folder)
    before = {str(p.relative_to(root)): _digest(p) for p in sorted(root.rglob("*"))}
    out_path = root / out
    replaceable_dir = not os.path.lexists(out_path) or (out_path.is_dir() and not out_path.is_symlink() and (
        not os.listdir(out_path) or (out_path / MARKER).is_file()))
    kwargs = {k: str(root / v) if k in ("report", "dump_ir", "eval", "settings") else v for k, v in options.items()}
    error: BaseException | None = None
    try:
        qcc.driver.compile(str(root / case.main), str(out_path), target=target, **kwargs)
    except BaseException as exc:  # judged below, then re-raised
        error = exc
    inputs = {case.main, options.get("eval"), options.get("settings")} - {None}

    def may_change(name: str) -> bool:
        if name in inputs:
            return False
        if _under(name, options.get("dump_ir")):
            return True
        if error is not None:
            return False
        if name == options.get("report"):
            return True
        if target == "c":
            return _under(name, out) and (force or replaceable_dir)
        return name == out

    for name, digest in before.items():
        if digest != "dir" and not may_change(name) and _digest(root / name) != digest:
            outcome = f"failed with {type(error).__name__}" if error is not None else "succeeded"
            raise Finding("lost", f"{name} was changed or deleted by a run that {outcome} "
                                  f"(-o {out} --target {target}{' --force' if force else ''})")
    if error is not None:
        raise error


# ----------------------------------------------------------------------------- registry for bench/fuzz.py
def outputs_seeds() -> list[bytes]:
    return [(DIGITS / "digits_cnn.onnx").read_bytes(), (DIGITS / "calib.npz").read_bytes()]


def no_seeds() -> list[bytes]:
    return [b""]


GENERATORS: dict[str, dict[str, Any]] = {
    "external": {"seeds": no_seeds, "read": read_external, "case": external_case},
    "hdf5": {"seeds": None, "read": read_hdf5, "case": hdf5_case},  # seeds: fuzz.nnp_seeds
    "special": {"seeds": no_seeds, "read": read_special, "case": special_case},
    "dtype": {"seeds": no_seeds, "read": read_dtype, "case": dtype_case},
    "bomb": {"seeds": None, "read": read_bomb, "case": bomb_case},  # seeds: fuzz.nnp_seeds
    "outputs": {"seeds": outputs_seeds, "read": None, "case": outputs_case},
}


def remove(path: str) -> None:
    """Remove a case folder whatever it holds (read-only folders, FIFOs, sockets)."""
    def unlock(func: Callable[..., Any], name: str, exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(name), 0o755)
            func(name)
        except OSError:
            pass

    shutil.rmtree(path, onerror=unlock)
