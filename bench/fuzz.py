"""Mutation campaign against qcc's readers: every case must end in success or a clean QccError.

Usage: python bench/fuzz.py --reader READER|all --cases N [--seed S] [--timeout SEC]
                            [--workers W] [--memory-mb M] [--save DIR] [--json]
READER: onnx, nnp, nnb, yaml, npz (mutated files); external, hdf5, special, dtype, bomb, outputs
(generated cases for issue 20's classes, bench/fuzz_classes.py: external references of every kind,
HDF5 features that read outside, special files, every ONNX element type against onnxruntime,
folding and aggregate bombs, output-path collisions).

Cases are truncations, byte flips, splices and structure-aware edits (ONNX: negative/huge dims,
dangling inputs, cycles, wrong types, external data outside the folder, huge ConstantOfShape;
archives: zip-slip and zip-bomb members, .npy header and .nntxt field edits; .nnb: header,
index and struct word edits; YAML: unsafe tags, alias bombs, deep nesting). Case `i` of seed
`S` is a pure function of (reader, S, i), so any finding can be replayed alone (`--save`).

Each case runs in a worker process (address space capped with RLIMIT_AS, qcc's limits set to
CAMPAIGN_LIMITS, cwd inside a sandbox) with a time limit, and is counted as `ok` (read fine), `clean` (a qcc error naming the file),
`unnamed` (a qcc error whose message does not name the file), `crash` (any other exception,
MemoryError, the worker dying from a signal, a file written anywhere but the case's own file, or
a case that raised the worker's peak memory by more than PEAK_GROWTH_MB: it allocated what the
limits should have refused first),
`hang` (time limit; a worker stuck in native code is killed by the parent), `wrong` (values that
differ from onnxruntime's), `outside` (a file outside the model's folder read into the model) or
`lost` (a compile changed or deleted a user's file it was not asked to replace).
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import logging
import multiprocessing as mp
import os
import queue
import random
import re
import resource
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
import warnings
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.fuzz_classes import (  # noqa: E402  (needs ROOT on sys.path)
    GENERATORS,
    Case,
    Finding,
    materialize,
    remove,
    run_outputs,
    setup_home,
)

DIGITS = ROOT / "examples" / "digits"
# Workers run with these limits under a memory cap of about four times them: any allocation the
# limits do not bound shows up as a MemoryError (a crash), not as a slow success.
CAMPAIGN_LIMITS = {"max_parameter_bytes": 512 * 1024 * 1024, "max_archive_bytes": 512 * 1024 * 1024}
# what one case may add to a worker's peak RSS: what the limits let through and the reader's own
# working memory; a case over it allocated something the limits should have refused first
PEAK_GROWTH_MB = 768
ESCAPE_NAME = "qcc_fuzz_escape"  # zip-slip members are named after this; none may ever appear
ABSOLUTE_ESCAPE = f"/tmp/{ESCAPE_NAME}_abs"


# ----------------------------------------------------------------------------- seeds
def onnx_seeds() -> list[bytes]:
    from tests.onnx_zoo import light_path

    return [(DIGITS / "digits_cnn.onnx").read_bytes(), light_path("squeezenet").read_bytes()]


def npz_seeds() -> list[bytes]:
    import numpy as np

    calib = (DIGITS / "calib.npz").read_bytes()
    arrays = dict(np.load(DIGITS / "test.npz"))
    compressed = io.BytesIO()
    np.savez_compressed(compressed, **arrays)  # DEFLATE members (the examples are stored)
    return [calib, (DIGITS / "test.npz").read_bytes(), compressed.getvalue()]


def _compile_digits(target: str, suffix: str, tmp: str) -> Path:
    import qcc.driver

    out = Path(tmp) / f"digits{suffix}"
    qcc.driver.compile(DIGITS / "digits_cnn.onnx", out, target=target)
    return out


def _with_h5_parameters(nnp: bytes) -> bytes:
    """The same archive with nnabla's .h5 parameter layout instead of parameter.protobuf."""
    import h5py

    from qcc.formats.nnp_archive import read_nnp

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "p.nnp"
        src.write_bytes(nnp)
        params = read_nnp(src).params
        h5 = Path(tmp) / "parameter.h5"
        with h5py.File(h5, "w") as handle:
            for index, (name, array) in enumerate(params.items()):
                dataset = handle.create_dataset(name, data=array)
                dataset.attrs["need_grad"] = False
                dataset.attrs["index"] = index
        out = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(nnp)) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
            for info in zin.infolist():
                if not info.filename.endswith(".protobuf"):
                    zout.writestr(info.filename, zin.read(info))
            zout.writestr("parameter.h5", h5.read_bytes())
        return out.getvalue()


def nnp_seeds() -> list[bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        nnp = _compile_digits("nnp", ".nnp", tmp).read_bytes()
    return [nnp, _with_h5_parameters(nnp)]


def _nnabla_converted(nnp: Path, tmp: str) -> bytes | None:
    """nnabla's own converter on an .nnp qcc wrote (None when nnabla_cli is unavailable)."""
    import subprocess

    cli = shutil.which("nnabla_cli") or str(Path(sys.executable).with_name("nnabla_cli"))
    out = Path(tmp) / "nnabla.nnb"
    try:
        subprocess.run([cli, "convert", "-b", "1", "--api", "44", str(nnp), str(out)], check=True,
                       capture_output=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.read_bytes()


def nnb_seeds() -> list[bytes]:
    """qcc's own .nnb (when the nnb backend is registered) and nnabla_cli's for the same network."""
    from qcc.errors import QccError

    seeds = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            seeds.append(_compile_digits("nnb", ".nnb", tmp).read_bytes())
        except QccError:  # the nnb backend is not registered (yet)
            pass
        converted = _nnabla_converted(_compile_digits("nnp", ".nnp", tmp), tmp)
        if converted is not None:
            seeds.append(converted)
    if not seeds:
        raise RuntimeError("no .nnb seed: neither the nnb backend nor nnabla_cli is available")
    return seeds


def yaml_seeds() -> list[bytes]:
    from qcc.formats.settings_yaml import export_settings
    from qcc.frontends.onnx import load_onnx

    return [export_settings(load_onnx(DIGITS / "digits_cnn.onnx")).encode()]


# ----------------------------------------------------------------------------- mutations
INTERESTING = (0, 1, 2, 3, 4, 7, 255, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)


def byte_mutation(rng: random.Random, data: bytes) -> bytes:
    kind = rng.choice(("truncate", "flip", "flips", "splice", "insert", "zero", "ff"))
    buf = bytearray(data)
    if not buf:
        return bytes(rng.randbytes(rng.randint(1, 64)))
    if kind == "truncate":
        return bytes(buf[: rng.randrange(len(buf))])
    if kind == "flip":
        i = rng.randrange(len(buf))
        buf[i] ^= 1 << rng.randrange(8)
    elif kind == "flips":
        for _ in range(rng.randint(2, 32)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
    elif kind == "splice":
        a, b = sorted(rng.randrange(len(buf)) for _ in range(2))
        c = rng.randrange(len(buf))
        buf[c:c] = buf[a:b]
    elif kind == "insert":
        i = rng.randrange(len(buf))
        buf[i:i] = rng.randbytes(rng.randint(1, 16))
    elif kind == "zero":
        i = rng.randrange(len(buf))
        buf[i:i + rng.randint(1, 64)] = bytes(min(64, len(buf) - i))
    else:
        i = rng.randrange(len(buf))
        buf[i:i + 8] = b"\xff" * min(8, len(buf) - i)
    return bytes(buf)


def _onnx_constant_of_shape(g: Any, rng: random.Random) -> None:
    from onnx import TensorProto, helper

    dims = rng.choice(([10**6, 10**6], [2**31], [-1, 4], [10**12], [3, 0, 2**40]))
    shape = helper.make_node("Constant", [], ["fuzz_shape"],
                             value=helper.make_tensor("v", TensorProto.INT64, [len(dims)], dims))
    fill = helper.make_node("ConstantOfShape", ["fuzz_shape"], ["fuzz_big"])
    g.node.insert(0, fill)
    g.node.insert(0, shape)


def onnx_structural(rng: random.Random, data: bytes) -> bytes:
    import onnx

    model = onnx.load_from_string(data)
    g = model.graph
    kind = rng.choice(("dim", "dangling", "cycle", "dtype", "attr", "opset", "drop_init", "dup_output",
                       "external", "constant_of_shape", "raw_data", "input_type", "int_values"))
    if kind == "dim" and (g.input or g.initializer):
        if g.initializer and rng.random() < 0.5:
            t = rng.choice(list(g.initializer))
            if t.dims:
                t.dims[rng.randrange(len(t.dims))] = rng.choice((-1, 0, 2**40, 10**12, 3))
        else:
            dims = g.input[0].type.tensor_type.shape.dim
            if dims:
                dims[rng.randrange(len(dims))].dim_value = rng.choice((0, 2**40, 10**12, 7))
    elif kind == "dangling" and g.node:
        n = rng.choice(list(g.node))
        if n.input:
            n.input[rng.randrange(len(n.input))] = "no_such_tensor"
    elif kind == "cycle" and len(g.node) > 2:
        a, b = rng.sample(range(len(g.node)), 2)
        if g.node[a].input and g.node[b].output:
            g.node[min(a, b)].input[0] = g.node[max(a, b)].output[0]
    elif kind == "dtype" and g.initializer:
        rng.choice(list(g.initializer)).data_type = rng.choice((2, 3, 6, 7, 8, 9, 10, 11, 16, 99))
    elif kind == "attr" and g.node:
        n = rng.choice(list(g.node))
        if n.attribute:
            a = rng.choice(list(n.attribute))
            if a.ints:
                a.ints[rng.randrange(len(a.ints))] = rng.choice((-5, 0, 2**31, -(2**40)))
            elif a.HasField("i"):
                a.i = rng.choice((-5, 0, 2**31))
            elif a.HasField("f"):
                a.f = rng.choice((float("nan"), float("inf"), -1.0))
            else:
                a.type = rng.choice((0, 3, 5, 99))
    elif kind == "opset":
        model.opset_import[0].version = rng.choice((1, 8, 22, 999))
    elif kind == "drop_init" and g.initializer:
        del g.initializer[rng.randrange(len(g.initializer))]
    elif kind == "dup_output" and len(g.node) > 1:
        g.node[1].output[0] = g.node[0].output[0]
    elif kind == "external" and g.initializer:
        t = rng.choice(list(g.initializer))
        t.ClearField("raw_data")
        t.ClearField("float_data")
        t.data_location = onnx.TensorProto.EXTERNAL
        location = rng.choice(("../../../../etc/passwd", "/etc/passwd", "missing.bin", "", ".", "case.onnx",
                               f"../{ESCAPE_NAME}"))
        entries = [("location", location), *rng.choice(([], [("offset", "8")], [("length", "99999999999")], [("offset", "-5")], [("offset", "x")]))]
        for key, value in entries:
            entry = t.external_data.add()
            entry.key, entry.value = key, value
    elif kind == "constant_of_shape":
        _onnx_constant_of_shape(g, rng)
    elif kind == "raw_data" and g.initializer:
        t = rng.choice(list(g.initializer))
        if t.raw_data:
            t.raw_data = t.raw_data[: rng.randrange(len(t.raw_data))]
        else:
            t.raw_data = b"\x01\x02\x03"
    elif kind == "input_type" and g.input:
        g.input[0].type.tensor_type.elem_type = rng.choice((0, 7, 8, 9, 14, 16, 99))
    elif kind == "int_values":
        ints = [t for t in g.initializer if t.data_type == onnx.TensorProto.INT64]
        if ints:
            from onnx import numpy_helper

            t = rng.choice(ints)
            array = numpy_helper.to_array(t).copy()
            if array.size:
                array.flat[rng.randrange(array.size)] = rng.choice((-7, 0, 10**12, 2**62, -(2**62)))
                t.CopyFrom(numpy_helper.from_array(array, t.name))
    return bytes(model.SerializeToString())


def _rebuild_zip(rng: random.Random, data: bytes, edit: Callable[[str, bytes], bytes] | None) -> bytes:
    """Rewrite an archive member by member, with archive-level attacks and an optional member edit."""
    src = zipfile.ZipFile(io.BytesIO(data))
    members = [(i.filename, src.read(i.filename)) for i in src.infolist()]
    out = io.BytesIO()
    kinds = ("slip", "absolute", "bomb", "declared_bomb", "many", "drop", "corrupt_member", "duplicate")
    kind = "edit" if edit is not None and rng.random() < 0.5 else rng.choice(kinds)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, payload in members:
            if kind == "drop" and rng.random() < 0.5:
                continue
            if kind == "corrupt_member" and rng.random() < 0.5:
                payload = byte_mutation(rng, payload)
            if kind == "edit" and edit is not None:
                payload = edit(name, payload)
            zf.writestr(name, payload)
        if kind == "slip":
            zf.writestr("../" * rng.randint(1, 6) + f"{ESCAPE_NAME}_{rng.randrange(1000)}", b"owned")
        elif kind == "absolute":
            zf.writestr(ABSOLUTE_ESCAPE, b"owned")
        elif kind == "bomb":
            zf.writestr((members[0][0] if members else "bomb") + ".bomb", b"\0" * (64 * 1024 * 1024))
        elif kind == "many":
            for i in range(rng.choice((100, 20000))):
                zf.writestr(f"m{i}", b"")
        elif kind == "duplicate" and members:
            name, payload = rng.choice(members)
            zf.writestr(name, byte_mutation(rng, payload))
    result = out.getvalue()
    if kind == "declared_bomb":  # lie about a member's uncompressed size in both headers
        result = _declare_size(result, rng.choice((10 * 1024**3, 0xFFFFFFFF, 0, 1)))
    return result


def _declare_size(archive: bytes, size: int) -> bytes:
    buf = bytearray(archive)
    local = buf.find(b"PK\x03\x04")
    central = buf.find(b"PK\x01\x02")
    if local >= 0:
        struct.pack_into("<I", buf, local + 22, min(size, 0xFFFFFFFF))
    if central >= 0:
        struct.pack_into("<I", buf, central + 24, min(size, 0xFFFFFFFF))
    return bytes(buf)


def zip_structural(rng: random.Random, data: bytes) -> bytes:
    """Zip-slip, zip-bomb, member swaps and corrupted members inside a valid archive."""
    return _rebuild_zip(rng, data, None)


def _npy_header_edit(rng: random.Random, payload: bytes) -> bytes:
    """Rewrite a .npy header: wrong dtype (objects, strings, big-endian), huge/negative shapes."""
    import numpy as np

    fmt = np.lib.format
    stream = io.BytesIO(payload)
    version = fmt.read_magic(stream)
    read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
    shape, fortran, dtype = read(stream)
    body = payload[stream.tell():]
    descr = fmt.dtype_to_descr(dtype)
    field = rng.choice(("descr", "shape", "fortran", "garbage"))
    if field == "descr":
        descr = rng.choice(("|O", "<f8", ">f4", "<U4", "|S3", "|V16", "<c8", "|b1", "<M8[s]", "<f2",
                            [("a", "<f4"), ("b", "|O")]))
    elif field == "shape":
        shape = rng.choice(((10**12,), (-1, 8), (2**31, 2**31), (), (0,), (*shape, 2), (*shape[:-1], shape[-1] * 2)))
    elif field == "fortran":
        fortran = not fortran
    header = repr({"descr": descr, "fortran_order": fortran, "shape": shape})
    if field == "garbage":
        header = rng.choice(("{'descr': __import__('os').system('true')}", "{" * 200, "[1, 2]", "{'shape': (1,)}"))
    header += " " * ((-(len(header) + 11)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1") + body


def npz_structural(rng: random.Random, data: bytes) -> bytes:
    return _rebuild_zip(rng, data, lambda name, payload: _npy_header_edit(rng, payload))


NUMBER = re.compile(rb"-?\b\d+(?:\.\d+)?\b")
NNTXT_VALUES = (b"-1", b"0", b"1000000000000", b"2147483648", b"-9223372036854775808", b"99999999999999999999",
                b"1e400", b"nan", b"3")


def _nntxt_edit(rng: random.Random, name: str, payload: bytes) -> bytes:
    if not name.endswith(".nntxt"):
        return payload
    kind = rng.choice(("number", "number", "type", "line_drop", "line_dup", "name"))
    if kind == "number":
        spots = list(NUMBER.finditer(payload))
        if spots:
            m = rng.choice(spots)
            return payload[:m.start()] + rng.choice(NNTXT_VALUES) + payload[m.end():]
    lines = payload.split(b"\n")
    i = rng.randrange(len(lines))
    if kind == "type":
        types = (b"Convolution", b"Affine", b"ReLU", b"Reshape", b"Concatenate", b"NoSuchFunction", b"Sink")
        lines[i] = re.sub(rb'type: "\w+"', b'type: "' + rng.choice(types) + b'"', lines[i])
    elif kind == "line_drop":
        del lines[i]
    elif kind == "line_dup":
        lines.insert(i, lines[i])
    else:
        lines[i] = re.sub(rb'"[^"]*"', b'"' + rng.choice((b"", b"../x", b"\\xff", b"x" * 300)) + b'"', lines[i])
    return b"\n".join(lines)


def nnp_structural(rng: random.Random, data: bytes) -> bytes:
    return _rebuild_zip(rng, data, lambda name, payload: _nntxt_edit(rng, name, payload))


def nnb_structural(rng: random.Random, data: bytes) -> bytes:
    """Edit uint32 words of the header, the slot index or the data area (counts, slots, offsets)."""
    buf = bytearray(data)
    words = len(buf) // 4
    num_data = struct.unpack_from("<I", buf, 48)[0] if words >= 14 else 0
    for _ in range(rng.randint(1, 3)):
        region = rng.random()
        if region < 0.35 or words <= 14:
            word = rng.randrange(min(14, words))
        elif region < 0.65 and num_data:
            word = 14 + rng.randrange(min(num_data, words - 14))
        else:
            word = rng.randrange(words)
        old = struct.unpack_from("<I", buf, 4 * word)[0]
        new = rng.choice((*INTERESTING, len(buf), len(buf) + 4, (old + 4) & 0xFFFFFFFF, (old - 4) & 0xFFFFFFFF,
                          (old * 2) & 0xFFFFFFFF, old ^ (1 << rng.randrange(32)), rng.getrandbits(32)))
        struct.pack_into("<I", buf, 4 * word, new)
    return bytes(buf)


def yaml_structural(rng: random.Random, data: bytes) -> bytes:
    text = data.decode()
    edits = ["!!python/object/apply:os.system ['echo owned']", "!!python/name:os.system", "FIXED99_3",
             "FIXED8_-4", "[1, 2]", "{a: b}", "&a [*a]", "FIXED16_77", "SIGN", "'\x00'", "FLOAT64",
             "!!binary aGVsbG8=", "2001-12-14t21:59:43.10-05:00", "~", "{implement: 99999999999999999999}",
             "{implement: true}", "[" * 3000 + "]" * 3000, "{a: " * 2000 + "x" + "}" * 2000, "*undefined",
             "FIXED8_" + "9" * 5000, ".nan"]
    lines = text.splitlines()
    kind = rng.random()
    if kind < 0.1:  # an alias bomb: 9 ** 9 references to one list
        bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
        bomb += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
        lines = ["variables:", "  bomb: *a9", *bomb] if rng.random() < 0.5 else [*lines, "variables: {x: *a9}", *bomb]
    elif lines:
        i = rng.randrange(len(lines))
        if ":" in lines[i]:
            key = lines[i].split(":")[0]
            lines[i] = f"{key}: {rng.choice(edits)}"
        else:
            lines[i] = rng.choice(edits)
    if rng.random() < 0.2:
        lines.append(rng.choice(("unknown_tensor_name: FIXED8_3", "  unknown_tensor_name: FIXED8_3",
                                 "? [complex, key]\n: FIXED8_3", "functions: 5")))
    return "\n".join(lines).encode()


# ----------------------------------------------------------------------------- readers
def read_onnx(path: str) -> None:
    import qcc.driver

    qcc.driver.load(path)


def read_npz(path: str) -> None:
    from qcc.data import bind_inputs, load_npz

    bind_inputs(_digits_model(), load_npz(path), path)


def read_nnp(path: str) -> None:
    import qcc.driver

    qcc.driver.load(path)


def read_nnb(path: str) -> None:
    """`qcc inspect` on the file (falls back to the format reader if inspect does not know .nnb)."""
    from qcc.inspect import inspect_path

    with open(os.devnull, "w") as sink:
        old, sys.stdout = sys.stdout, sink
        try:
            inspect_path(path, as_json=False)
        finally:
            sys.stdout = old


def read_yaml(path: str) -> None:
    from qcc.formats.settings_yaml import apply_settings_file

    apply_settings_file(copy.deepcopy(_digits_model()), path)


_CACHE: dict[str, Any] = {}


def _digits_model() -> Any:
    if "digits" not in _CACHE:
        from qcc.frontends.onnx import load_onnx

        _CACHE["digits"] = load_onnx(DIGITS / "digits_cnn.onnx")
    return _CACHE["digits"]


READERS: dict[str, dict[str, Any]] = {
    "onnx": {"seeds": onnx_seeds, "read": read_onnx, "suffix": ".onnx", "structural": onnx_structural},
    # archives: most byte mutations stop at the zip CRC, so structural edits reach the members
    "npz": {"seeds": npz_seeds, "read": read_npz, "suffix": ".npz", "structural": npz_structural, "rate": 0.7},
    "nnp": {"seeds": nnp_seeds, "read": read_nnp, "suffix": ".nnp", "structural": nnp_structural, "rate": 0.7},
    "nnb": {"seeds": nnb_seeds, "read": read_nnb, "suffix": ".nnb", "structural": nnb_structural},
    "yaml": {"seeds": yaml_seeds, "read": read_yaml, "suffix": ".yaml", "structural": yaml_structural},
    # issue 20's classes: generated cases (files, links, FIFOs) rather than mutated bytes (bench/fuzz_classes.py)
    **{name: {**entry, "seeds": entry["seeds"] or nnp_seeds} for name, entry in GENERATORS.items()},
}
OUTCOMES = ("ok", "clean", "crash", "hang", "unnamed", "wrong", "outside", "lost")
BAD = ("crash", "hang", "unnamed", "wrong", "outside", "lost")


def make_case(reader: str, seeds: list[bytes], seed: int, index: int) -> bytes | Case:
    """Case `index` of campaign `seed`: independent of every other case (and of PYTHONHASHSEED)."""
    rng = random.Random(f"{reader}/{seed}/{index}")
    if "case" in READERS[reader]:
        return READERS[reader]["case"](rng, seeds)  # type: ignore[no-any-return]
    base = rng.choice(seeds)
    structural = READERS[reader]["structural"]
    try:
        if structural is not None and rng.random() < READERS[reader].get("rate", 0.5):
            data = structural(rng, base)
            if rng.random() < 0.3:
                data = byte_mutation(rng, data)
            return bytes(data)
    except Exception:  # a mutation that cannot apply to this seed: use a byte mutation
        pass
    return byte_mutation(rng, base)


# ----------------------------------------------------------------------------- worker
class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def _limit_memory(megabytes: int) -> None:
    """Cap the worker's address space: a reader that allocates unboundedly fails with MemoryError."""
    if megabytes <= 0:
        return
    with open("/proc/self/statm") as handle:
        mapped = int(handle.read().split()[0]) * resource.getpagesize()
    cap = mapped + megabytes * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith(key))


def _reset_peak() -> int:
    """Reset this process's peak RSS (VmHWM) to its current RSS; returns that RSS in KB."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:  # an old kernel: the peak then counts from the worker's start
        pass
    return _status_kb("VmRSS")


def _run_case(reader: str, path: str, timeout: float, case: bytes | Case) -> tuple[str, str]:
    from qcc.errors import QccError

    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        if reader == "outputs":
            assert isinstance(case, Case)
            run_outputs(os.path.dirname(path), case)
        else:
            READERS[reader]["read"](path)
        return "ok", ""
    except _Timeout:
        return "hang", f"over {timeout:g}s (in Python)"
    except Finding as finding:
        return finding.outcome, str(finding)[:300]
    except QccError as exc:
        named = os.path.dirname(path) if reader == "outputs" else path  # an output error names an output
        if named not in str(exc):  # every message names the file it is about
            return "unnamed", f"{type(exc).__name__}: {str(exc)[:200]}"
        return "clean", str(exc)[:200]
    except MemoryError:
        return "crash", "MemoryError (the reader allocated past the worker's memory cap)"
    except BaseException as exc:
        return "crash", "".join(traceback.format_exception_only(type(exc), exc)).strip()[:300]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _worker(reader: str, seeds: list[bytes], seed: int, timeout: float, memory_mb: int, tasks: Any,
            results: Any, home: str) -> None:
    signal.signal(signal.SIGALRM, _alarm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles ^C
    warnings.simplefilter("ignore")  # zipfile's duplicate-name warnings while building cases
    from qcc import limits

    limits.configure([f"{name}={value}" for name, value in CAMPAIGN_LIMITS.items()])
    logging.disable(logging.WARNING)  # readers' own log lines (nnabla, torch) are not findings
    _limit_memory(memory_mb)
    cases, cwd = os.path.join(home, "case"), os.path.join(home, "cwd")
    os.makedirs(cwd, exist_ok=True)
    setup_home(home, cwd)  # the secrets that cases try to reach
    os.chdir(cwd)
    baseline = set(os.listdir(cwd))
    suffix = READERS[reader].get("suffix", "")
    while True:
        index = tasks.get()
        if index is None:
            return
        os.makedirs(cases, exist_ok=True)
        case = make_case(reader, seeds, seed, index)
        if isinstance(case, Case):
            created = materialize(case, cases)
            path = os.path.join(cases, case.main)
        else:
            path = os.path.join(cases, "case" + suffix)
            created = {"case" + suffix}
            with open(path, "wb") as handle:
                handle.write(case)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        own_before = _reset_peak()
        outcome, detail = _run_case(reader, path, timeout, case)
        grew_mb = (_status_kb("VmHWM") - own_before) // 1024  # this case's own peak, not the worker's
        # a reader may read its input, nothing else: any new file is a failure (the outputs
        # reader judges what a compile wrote itself)
        written = sorted(set(os.listdir(cases)) - created) if reader != "outputs" else []
        written += sorted(set(os.listdir(cwd)) - baseline)
        if written:
            outcome, detail = "crash", f"wrote files {written[:5]} ({outcome}: {detail})"
            for name in set(os.listdir(cwd)) - baseline:
                remove(os.path.join(cwd, name))
        remove(cases)
        rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if grew_mb > PEAK_GROWTH_MB and outcome in ("ok", "clean"):  # allocated first, checked after?
            outcome, detail = "crash", (f"the case raised the worker's peak memory by {grew_mb} MB, past what "
                                        f"the limits allow ({outcome}: {detail})")
        results.put((index, outcome, detail, rss_kb, rss_kb - rss_before))


class _Slot:
    """One worker process, its task queue and the case it is running."""

    def __init__(self, ctx: Any, args: tuple[Any, ...], results: Any, home: str) -> None:
        self.tasks = ctx.Queue()
        self.process = ctx.Process(target=_worker, args=(*args, self.tasks, results, home), daemon=True)
        self.process.start()
        self.index: int | None = None
        self.started = 0.0

    def give(self, index: int) -> None:
        self.index, self.started = index, time.monotonic()
        self.tasks.put(index)

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)


def run_campaign(reader: str, count: int, seed: int, timeout: float = 10.0, workers: int = 2,
                 memory_mb: int = 2048, verbose: bool = True, first: int = 0) -> dict[str, Any]:
    """Run cases first..first+count-1 of campaign `seed`; returns counts, findings and timings."""
    seeds = READERS[reader]["seeds"]()
    counts: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    heavy: list[tuple[int, int, str]] = []
    findings: list[tuple[int, str, str]] = []
    peak_rss_kb = 0
    ctx = mp.get_context("fork")
    start = time.perf_counter()
    sandbox = tempfile.mkdtemp(prefix="qcc-fuzz-")
    if os.path.exists(ABSOLUTE_ESCAPE):
        os.unlink(ABSOLUTE_ESCAPE)
    results = ctx.Queue()
    spawned = 0

    def spawn() -> _Slot:
        nonlocal spawned
        spawned += 1  # zip-slip members climb at most 6 levels: all of them stay inside the sandbox
        home = os.path.join(sandbox, f"w{spawned}", "a", "b", "c", "d", "e", "f")
        return _Slot(ctx, (reader, seeds, seed, timeout, memory_mb), results, home)

    todo = list(range(first + count - 1, first - 1, -1))
    slots = [spawn() for _ in range(max(1, workers))]

    def record(index: int, outcome: str, detail: str) -> None:
        counts[outcome] += 1
        if outcome == "clean":
            reasons[_reason(detail)] += 1
        if outcome in BAD:
            findings.append((index, outcome, detail))

    def handle(item: tuple[int, str, str, int, int]) -> None:
        nonlocal peak_rss_kb
        index, outcome, detail, rss_kb, grew_kb = item
        peak_rss_kb = max(peak_rss_kb, rss_kb)
        if grew_kb > 256 * 1024:  # this case raised the worker's peak by more than 256 MB
            heavy.append((index, round(grew_kb / 1024), outcome))
        record(index, outcome, detail)
        slot = next(s for s in slots if s.index == index)
        slot.index = None
        if todo:
            slot.give(todo.pop())

    try:
        for slot in slots:
            if todo:
                slot.give(todo.pop())
        while any(slot.index is not None for slot in slots):
            try:
                handle(results.get(timeout=0.5))
            except queue.Empty:
                pass
            now = time.monotonic()
            for n, slot in enumerate(slots):
                dead = slot.index is not None and not slot.process.is_alive()
                stuck = slot.index is not None and now - slot.started > timeout + 10
                if not (dead or stuck):
                    continue
                while True:  # results that arrived before the worker died belong to other cases
                    try:
                        handle(results.get(timeout=1))
                    except queue.Empty:
                        break
                if slot.index is None:
                    continue
                code = slot.process.exitcode
                slot.stop()
                if dead:
                    record(slot.index, "crash", f"worker died (exit code {code})")
                else:
                    record(slot.index, "hang", f"over {timeout:g}s (killed in native code)")
                slots[n] = spawn()
                if todo:
                    slots[n].give(todo.pop())
        for slot in slots:
            slot.tasks.put(None)
    finally:
        for slot in slots:
            slot.stop()
        escaped = [os.path.join(d, f) for d, _, files in os.walk(sandbox) for f in files if ESCAPE_NAME in f]
        escaped += [ABSOLUTE_ESCAPE] if os.path.exists(ABSOLUTE_ESCAPE) else []
        escaped += [str(p) for p in Path(sandbox).parent.glob(f"{ESCAPE_NAME}*")]
        shutil.rmtree(sandbox, ignore_errors=True)
    elapsed = time.perf_counter() - start
    result = {"reader": reader, "cases": count, "first": first, "seed": seed, "seeds": len(seeds),
              "counts": {k: counts.get(k, 0) for k in OUTCOMES},
              "findings": findings, "top_clean_reasons": reasons.most_common(12), "escaped_files": escaped, "seconds": round(elapsed, 1),
              "peak_worker_rss_mb": round(peak_rss_kb / 1024, 1),
              "heavy_cases": sorted(heavy, key=lambda h: -h[1])[:10], "timeout": timeout, "workers": workers,
              "memory_mb": memory_mb}
    if verbose:
        print(f"{reader}: {count} cases (seed {seed}) in {elapsed:.1f}s: " +
              ", ".join(f"{k} {counts.get(k, 0)}" for k in OUTCOMES) +
              f"; peak worker RSS {result['peak_worker_rss_mb']} MB")
        for index, outcome, detail in findings[:30]:
            print(f"  case {index}: {outcome}: {detail}")
        if escaped:
            print(f"  files written outside the sandbox: {escaped}")
        for reason, n in reasons.most_common(12):
            print(f"  {n:6d} clean: {reason}")
    return result


def _reason(message: str) -> str:
    """A clean error's message without the case path, names and numbers: what stopped the case."""
    text = " ".join(message.split(": ", 1)[-1].split())
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'_'", text)
    return re.sub(r"(?<![A-Za-z-])\d+", "N", text)[:70]


def save_cases(reader: str, seed: int, indices: list[int], directory: str) -> list[str]:
    """Write the given cases as files (to replay a finding: `qcc inspect DIR/case-<i>.<ext>`)."""
    seeds = READERS[reader]["seeds"]()
    os.makedirs(directory, exist_ok=True)
    paths = []
    for index in indices:
        case = make_case(reader, seeds, seed, index)
        if isinstance(case, Case):  # a folder: the files, links and FIFOs of the case
            folder = os.path.join(directory, f"case-{index}")
            os.makedirs(folder, exist_ok=True)
            materialize(case, folder)
            paths.append(os.path.join(folder, case.main))
            continue
        path = os.path.join(directory, f"case-{index}{READERS[reader]['suffix']}")
        with open(path, "wb") as handle:
            handle.write(case)
        paths.append(path)
    return paths


def markdown_section(results: list[dict[str, Any]]) -> str:
    """The `## Mutation campaign` section of docs/benchmarks.md for finished campaigns."""
    import platform

    first = max(results, key=lambda r: r["cases"])
    capped = " ".join(f"--max-cases {r['reader']}={r['cases']}" for r in results if r["cases"] < first["cases"])
    lines = ["## Mutation campaign", "",
             f"`python bench/fuzz.py --reader all --cases {first['cases']} {capped + ' ' if capped else ''}"
             f"--seed {first['seed']} --doc`, "
             f"{time.strftime('%Y-%m-%d')}, {platform.machine()}, "
             f"{results[0]['workers']} workers, {results[0]['timeout']:g} s per case, workers capped at "
             f"{results[0]['memory_mb']} MB of address space with qcc's limits "
             + ", ".join(f"{k}={v // (1024 * 1024)} MiB" for k, v in CAMPAIGN_LIMITS.items())
             + ". `clean` = a qcc error naming the file; `unnamed` = a qcc error that does not name it; "
             "`wrong` = values that differ from onnxruntime's; `outside` = bytes of a file outside the model's "
             "folder in the loaded model; `lost` = a user's file changed or deleted by a compile not asked to "
             "replace it; `escaped` = a file written outside the case folder.", "",
             "| reader | seed files | seed | cases | ok | clean | crash | hang | unnamed | wrong | outside | lost "
             "| escaped | seconds | peak worker RSS (MB) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        c = r["counts"]
        lines.append(f"| {r['reader']} | {r['seeds']} | {r['seed']} | {r['cases']} | {c['ok']} | {c['clean']} | {c['crash']} | "
                     f"{c['hang']} | {c['unnamed']} | {c['wrong']} | {c['outside']} | {c['lost']} | "
                     f"{len(r['escaped_files'])} | {r['seconds']} | {r['peak_worker_rss_mb']} |")
    lines += ["", "What stopped the refused cases most often (per reader, top 5):", ""]
    for r in results:
        top = "; ".join(f"{' '.join(reason.split())} ({n})" for reason, n in r["top_clean_reasons"][:5])
        lines.append(f"- **{r['reader']}**: {top}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reader", required=True, choices=[*sorted(READERS), "all"])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--max-cases", action="append", default=[], metavar="READER=N",
                        help="fewer cases for a slow reader (e.g. bomb=1000); repeatable")
    parser.add_argument("--first", type=int, default=0, help="index of the first case (to resume or replay)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per case")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memory-mb", type=int, default=2048, help="address space per worker beyond its start")
    parser.add_argument("--save", metavar="DIR", help="write the crashing/hanging cases into DIR")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--doc", action="store_true", help="write the results into docs/benchmarks.md")
    args = parser.parse_args()
    results = []
    caps = {name: int(count) for name, _, count in (item.partition("=") for item in args.max_cases)}
    for reader in sorted(READERS) if args.reader == "all" else [args.reader]:
        result = run_campaign(reader, min(args.cases, caps.get(reader, args.cases)), args.seed, args.timeout,
                              args.workers, args.memory_mb, verbose=not args.json, first=args.first)
        if args.save and result["findings"]:
            for path in save_cases(reader, args.seed, [i for i, _, _ in result["findings"]], args.save):
                print(f"  saved {path}", file=sys.stderr)
        results.append(result)
    if args.json:
        print(json.dumps(results if args.reader == "all" else results[0], indent=2))
    if args.doc:
        from bench.doc_section import replace_section

        replace_section("## Mutation campaign", markdown_section(results))
    bad = sum(len(r["findings"]) + len(r["escaped_files"]) for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
