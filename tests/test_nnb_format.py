"""The .nnb format layer against nnabla's own converter: byte-identical round trips, decoded
contents that match nnabla's parameters, and a reader that rejects every corruption cleanly."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from qcc.backends.nnb import format as nnbf
from qcc.backends.nnb import functions as nnbfun
from qcc.backends.nnb.format import (
    DataType,
    Function,
    NnbFile,
    Variable,
    decode_values,
    encode_values,
    read_nnb,
    write_nnb,
)

from qcc.errors import InternalError, InvalidInputError, UnsupportedError

from .nnb_util import nnabla_cli as _nnabla_cli

nn = pytest.importorskip("nnabla")


# ----------------------------------------------------------------------------- fixtures


def _save(path: Path, x: object, y: object) -> None:
    from nnabla.utils.save import save

    save(
        str(path),
        {
            "networks": [{"name": "net", "batch_size": 1, "outputs": {"y": y}, "names": {"x": x}}],
            "executors": [{"name": "runtime", "network": "net", "data": ["x"], "output": ["y"]}],
        },
    )


def _params() -> dict[str, np.ndarray]:
    return {k: v.d.copy() for k, v in nn.get_parameters(grad_only=False).items()}


def _build_networks(d: Path) -> dict[str, dict[str, np.ndarray]]:
    """mlp: Affine-ReLU-Affine; cnn: Conv-ReLU-MaxPool-Affine; ks: one of each argument kind;
    sign: mlp whose first weight is +-1 so it can be stored as SIGN."""
    import nnabla.functions as F
    import nnabla.parametric_functions as PF

    params = {}
    rng = np.random.RandomState(0)
    for name in ("mlp", "sign"):
        nn.clear_parameters()
        x = nn.Variable((1, 8))
        h = F.relu(PF.affine(x, 16, name="fc1"))
        y = PF.affine(h, 4, name="fc2")
        for v in nn.get_parameters().values():
            v.d = rng.randn(*v.shape)
        if name == "sign":
            w = nn.get_parameters()["fc1/affine/W"]
            w.d = np.where(rng.rand(*w.shape) > 0.5, 1.0, -1.0)
        _save(d / f"{name}.nnp", x, y)
        params[name] = _params()

    nn.clear_parameters()
    x = nn.Variable((1, 3, 8, 8))
    h = F.relu(PF.convolution(x, 4, (3, 3), pad=(1, 1), name="conv1"))
    y = PF.affine(F.max_pooling(h, (2, 2)), 5, name="fc")
    for v in nn.get_parameters().values():
        v.d = rng.randn(*v.shape) * 0.3
    _save(d / "cnn.nnp", x, y)
    params["cnn"] = _params()

    nn.clear_parameters()
    x = nn.Variable((1, 3, 6, 6))
    h = PF.convolution(x, 4, (3, 3), pad=(1, 1), name="c1")
    h = PF.batch_normalization(h, batch_stat=False, name="bn")  # repeated int, floats, bools
    h = F.pad(h, (1, 1, 1, 1), mode="constant", constant_value=0.25)  # string choice + float
    h = F.average_pooling(h, (2, 2), including_pad=False)
    h = F.concatenate(F.mul_scalar(h, 0.5), F.add_scalar(h, -1.25), axis=1)
    h = F.reshape(F.transpose(h, (0, 2, 3, 1)), (1, -1))
    y = F.softmax(F.add2(h, h), axis=1)
    _save(d / "ks.nnp", x, y)
    params["ks"] = _params()
    return params


# name -> (network, extra nnabla_cli convert options, settings: variable-type rewrite or None)
CASES = {
    "mlp-v2-api44": ("mlp", ["--api", "44"], None),
    "mlp-v3-api44": ("mlp", ["--api", "44", "-d", "nnb_3"], None),
    "cnn-v2-api45": ("cnn", [], None),
    "cnn-v3-api44": ("cnn", ["--api", "44", "-d", "nnb_3"], None),
    "cnn-fixed16-v3": ("cnn", ["--api", "44", "-d", "nnb_3"], "FIXED16"),
    "cnn-fixed8-v2": ("cnn", ["--api", "44"], "FIXED8"),
    "ks-v2-api44": ("ks", ["--api", "44"], None),
    "ks-v3-api45": ("ks", ["-d", "nnb_3"], None),
    "sign-v2-api44": ("sign", ["--api", "44"], "SIGN"),
}


def _settings(template: Path, out: Path, kind: str) -> None:
    """FIXED16/FIXED8: every variable fixed point (explicit positions for activations and
    biases, automatic ones for weights); SIGN: only the first weight."""
    import yaml

    settings = yaml.safe_load(template.read_text())
    bits = 16 if kind == "FIXED16" else 8
    for name in settings["variables"]:
        if kind == "SIGN":
            if name == "fc1/affine/W":
                settings["variables"][name] = "SIGN"
        elif name.endswith("/W"):
            settings["variables"][name] = f"FIXED{bits}"
        else:
            settings["variables"][name] = f"FIXED{bits}_{bits // 2 - 1}"
    out.write_text(yaml.safe_dump(settings))


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, np.ndarray]]]:
    d = tmp_path_factory.mktemp("nnb")
    params = _build_networks(d)
    _nnabla_cli(
        *(["nnb_template", "-b", "1", "--api", "44", str(d / f"{n}.nnp"), str(d / f"{n}.yaml")]
          for n in ("cnn", "sign"))
    )  # fmt: skip
    commands = []
    for case, (net, opts, kind) in CASES.items():
        extra = list(opts)
        if kind:
            _settings(d / f"{net}.yaml", d / f"{case}.yaml", kind)
            extra += ["-s", str(d / f"{case}.yaml")]
        files = [str(d / f"{net}.nnp"), str(d / f"{case}.nnb")]
        commands.append(["convert", "-b", "1", *extra, *files])
    _nnabla_cli(*commands)
    return d, params


def _load(nets: tuple[Path, dict], case: str) -> bytes:
    return (nets[0] / f"{case}.nnb").read_bytes()


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("case", sorted(CASES))
def test_nnabla_file_round_trips_byte_identically(nets: tuple[Path, dict], case: str) -> None:
    data = _load(nets, case)
    nnb = read_nnb(data, f"{case}.nnb")
    assert write_nnb(nnb) == data
    assert read_nnb(write_nnb(nnb), "again") == nnb


@pytest.mark.parametrize("case", sorted(CASES))
def test_header_and_functions_match_nnabla(nets: tuple[Path, dict], case: str) -> None:
    """Versions, API level and function ids/argument formats as nnabla's table defines them."""
    import nnabla.utils.converter as conv

    net, opts, _ = CASES[case]
    nnb = read_nnb(_load(nets, case), case)
    assert nnb.version == (3 if "nnb_3" in opts else 2)
    api = conv.get_api_level_info()
    api.set_api_level(int(opts[opts.index("--api") + 1]) if "--api" in opts else -1)
    assert nnb.api_level == api.get_current_level()
    expected = {
        "mlp": ["Affine", "ReLU", "Affine"],
        "sign": ["Affine", "ReLU", "Affine"],
        "cnn": ["Convolution", "ReLU", "MaxPooling", "Affine"],
        "ks": ["Convolution", "BatchNormalization", "Pad", "AveragePooling", "MulScalar",
               "AddScalar", "Concatenate", "Transpose", "Reshape", "Add2", "Softmax"],
    }[net]  # fmt: skip
    table = nnbfun.default_table()
    got = [table.by_id(fn.type_id, nnb.api_level) for fn in nnb.functions]
    assert sorted(s.name for s in got if s) == sorted(expected)
    for spec in got:
        assert spec is not None
        assert spec.id == api.get_func_id(spec.name)
        assert spec.argfmt == api.get_argument_code(spec.name)


def _param_by_shape(nnb: NnbFile, shape: tuple[int, ...]) -> Variable:
    (var,) = [v for v in nnb.variables if v.data is not None and v.shape == shape]
    return var


@pytest.mark.parametrize("case", ["mlp-v2-api44", "cnn-v3-api44"])
def test_float_parameters_decode_to_nnabla_values(nets: tuple[Path, dict], case: str) -> None:
    """Weights come back exactly; Affine weights are stored transposed to (out, in)."""
    net = CASES[case][0]
    nnb = read_nnb(_load(nets, case), case)
    for name, value in nets[1][net].items():
        var = _param_by_shape(nnb, value.shape)
        got = decode_values(var.data or b"", var.dtype, var.size)
        if "affine/W" in name:
            value = value.reshape(value.shape[0], -1).T
        np.testing.assert_array_equal(got, value.astype(np.float32).reshape(-1))
        assert encode_values(got, var.dtype) == var.data


@pytest.mark.parametrize("case", ["cnn-fixed16-v3", "cnn-fixed8-v2"])
def test_fixed_point_parameters_decode_to_rounded_values(
    nets: tuple[Path, dict], case: str
) -> None:
    bits = 16 if "16" in case else 8
    nnb = read_nnb(_load(nets, case), case)
    for name, value in nets[1]["cnn"].items():
        var = _param_by_shape(nnb, value.shape)
        assert var.dtype == (DataType.INT16 if bits == 16 else DataType.INT8)
        if name.endswith("/b"):
            assert var.fp_pos == bits // 2 - 1
        if "affine/W" in name:
            value = value.reshape(value.shape[0], -1).T
        want = np.clip(np.round(value * 2.0**var.fp_pos), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        got = decode_values(var.data or b"", var.dtype, var.size)
        np.testing.assert_array_equal(got, want.reshape(-1))
    acts = [v for v in nnb.variables if v.buffer is not None]
    assert acts and all(v.fp_pos == bits // 2 - 1 for v in acts)


def test_sign_parameters_pack_lsb_first(nets: tuple[Path, dict]) -> None:
    nnb = read_nnb(_load(nets, "sign-v2-api44"), "sign")
    w = nets[1]["sign"]["fc1/affine/W"]
    var = _param_by_shape(nnb, w.shape)
    assert var.dtype == DataType.SIGN and len(var.data or b"") == w.size // 8
    got = decode_values(var.data or b"", DataType.SIGN, var.size)
    np.testing.assert_array_equal(got, w.T.reshape(-1))
    assert encode_values(w.T, DataType.SIGN) == var.data


def test_version3_buffers_count_bytes(nets: tuple[Path, dict]) -> None:
    v2 = read_nnb(_load(nets, "mlp-v2-api44"), "v2")
    v3 = read_nnb(_load(nets, "mlp-v3-api44"), "v3")
    assert [4 * b for b in v2.buffers] == list(v3.buffers)
    assert v2.variables == v3.variables and v2.functions == v3.functions


def test_hand_built_file_round_trips() -> None:
    """Every argument kind, written from scratch: read(write(x)) == x and nnabla's layout."""
    table = nnbfun.default_table()
    pad = table.spec("Pad", 44)
    assert [a.code for a in pad.args] == ["iI", "i", "f"] and pad.args[1].choices[0] == "constant"
    conv = table.spec("Convolution", 44)
    w = np.arange(-8, 8).reshape(2, 1, 2, 4)
    nnb = NnbFile(
        version=3,
        api_level=44,
        buffers=(128, 96),
        variables=(
            Variable((1, 1, 4, 4), DataType.INT16, 12, buffer=0),
            Variable((2, 1, 2, 4), DataType.INT8, 7, data=encode_values(w, DataType.INT8)),
            Variable((1, 2, 3, 1), DataType.INT16, 9, buffer=1),
            Variable((1, 2, 5, 3), DataType.FLOAT, 0, buffer=0),
        ),
        functions=(
            Function(conv.id, (0, 1), (2,), (1, (0, 0), (1, 1), (1, 1), 1, False)),
            Function(pad.id, (2,), (3,), ((1, 1, 1, 1), 2, -0.5), impl=100),
        ),
        inputs=(0,),
        outputs=(3,),
    )
    data = write_nnb(nnb)
    back = read_nnb(data, "hand.nnb")
    assert back.functions[0].args[-1] == 0 and back.functions[1].args == ((1, 1, 1, 1), 2, -0.5)
    assert write_nnb(back) == data
    got = decode_values(back.variables[1].data or b"", DataType.INT8, 16)
    assert got.tolist() == w.reshape(-1).tolist()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": 4}, "version 4"),
        ({"inputs": (7,)}, "input variable indices [7]"),
        ({"buffers": (8, 96)}, "needs 32 bytes but buffer 0 holds 8"),
        ({"functions": (Function(265, (0, 1), (2,), (1,)),)}, "takes 6 encoded arguments"),
        ({"functions": (Function(360, (0, 1), (2,)),)}, "not defined at API level 44"),
        ({"variables": (Variable((1, 1, 4, 4), DataType.INT16, 16, buffer=0),)}, "fp_pos 16"),
    ],
)
def test_writer_rejects_inconsistent_files(change: dict, message: str) -> None:
    base = NnbFile(
        3, 44, (64, 96),
        (Variable((1, 1, 4, 4), DataType.INT16, 12, buffer=0),
         Variable((3,), DataType.FLOAT, data=bytes(12)),
         Variable((4,), DataType.FLOAT, buffer=1)),
        (Function(0, (0, 1), (2,), (1,)),), (0,), (2,),
    )  # fmt: skip
    fields = {k: getattr(base, k) for k in ("version", "api_level", "buffers", "variables",
                                            "functions", "inputs", "outputs")}  # fmt: skip
    write_nnb(base)
    with pytest.raises(InternalError, match=message.replace("[", r"\[").replace("]", r"\]")):
        write_nnb(NnbFile(**{**fields, **change}))


# ----------------------------------------------------------------------------- corruption

HEADER_FIELDS = ("version", "api_level", "nbuf", "sbuf", "nvar", "svar", "nfun", "sfun",
                 "nin", "sin", "nout", "sout", "num_data", "data_size")  # fmt: skip


class _File:
    """Patch helpers that address a file by its own index (header fields, slots, structs)."""

    def __init__(self, data: bytes) -> None:
        self.b = bytearray(data)
        self.h = dict(zip(HEADER_FIELDS, struct.unpack_from("<14I", data)))
        self.base = 56 + 4 * self.h["num_data"]

    def slot(self, slot: int) -> int:
        return self.base + struct.unpack_from("<I", self.b, 56 + 4 * slot)[0]

    def u32(self, at: int) -> int:
        return struct.unpack_from("<I", self.b, at)[0]

    def put(self, at: int, value: int, fmt: str = "<I") -> bytes:
        struct.pack_into(fmt, self.b, at, value)
        return bytes(self.b)

    def header(self, field: str, value: int) -> bytes:
        return self.put(4 * HEADER_FIELDS.index(field), value)

    def variable(self, n: int) -> int:
        return self.slot(self.u32(self.slot(self.h["svar"]) + 4 * n))

    def function(self, n: int) -> int:
        return self.slot(self.u32(self.slot(self.h["sfun"]) + 4 * n))


def _rejects(data: bytes, message: str, error: type[Exception] = InvalidInputError) -> None:
    with pytest.raises(error) as info:
        read_nnb(data, "bad.nnb")
    assert "bad.nnb" in str(info.value)
    assert message in str(info.value), str(info.value)


def test_every_truncation_is_rejected(nets: tuple[Path, dict]) -> None:
    data = _load(nets, "mlp-v2-api44")
    for n in range(len(data)):
        with pytest.raises(InvalidInputError, match=r"bad\.nnb"):
            read_nnb(data[:n], "bad.nnb")
    _rejects(data + bytes(4), "but the file has")


def test_corrupted_header_fields(nets: tuple[Path, dict]) -> None:
    data = _load(nets, "cnn-v2-api45")
    _rejects(_File(data).header("version", 1), "version 1")
    _rejects(_File(data).header("api_level", 0), "API level 0")
    _rejects(_File(data).header("api_level", 46), "newer than", UnsupportedError)
    _rejects(_File(data).header("nvar", 0xFFFFFFFF), "past the end")
    _rejects(_File(data).header("nfun", 0x40000000), "past the end")
    _rejects(_File(data).header("num_data", 0x3FFFFFFF), "index entries")
    _rejects(_File(data).header("data_size", 0xFFFFFFF0), "data bytes")
    _rejects(_File(data).header("svar", 0x7FFFFFFF), "refers to slot 2147483647")


def _patch(data: bytes, at: Callable[[_File], int], value: int, fmt: str = "<I") -> bytes:
    f = _File(data)
    return f.put(at(f), value, fmt)


def test_flipped_slots(nets: tuple[Path, dict]) -> None:
    data = _load(nets, "cnn-v3-api44")
    f = _File(data)
    num_data, var_list_slot = f.h["num_data"], f.h["svar"]
    param_slot = struct.unpack_from("<i", data, f.variable(5) + 16)[0]  # conv weight data
    fn0_outputs = f.u32(f.function(0) + 16)
    fn1_inputs = f.u32(f.function(1) + 8)

    def shape_slot(f: _File) -> int:
        return f.variable(0) + 8

    def fn1_inputs_slot(f: _File) -> int:
        return f.function(1) + 8

    _rejects(_patch(data, shape_slot, num_data), f"refers to slot {num_data}")
    _rejects(_patch(data, shape_slot, param_slot), "is used both as")
    _rejects(_patch(data, fn1_inputs_slot, var_list_slot), "is used both as")
    # a distinct slot aimed at another block's bytes, or at a misaligned offset
    _rejects(_patch(data, lambda f: 56 + 4 * fn1_inputs, f.u32(56 + 4 * fn0_outputs)), "overlaps")
    misaligned = f.u32(56 + 4 * fn1_inputs) + 2
    _rejects(_patch(data, lambda f: 56 + 4 * fn1_inputs, misaligned), "unaligned")


def test_corrupted_variables_and_functions(nets: tuple[Path, dict]) -> None:
    data = _load(nets, "cnn-v3-api44")

    def var0(offset: int) -> Callable[[_File], int]:
        return lambda f: f.variable(0) + offset

    def fn0(offset: int) -> Callable[[_File], int]:
        return lambda f: f.function(0) + offset

    _rejects(_patch(data, var0(0), 3), "has id 3")
    _rejects(_patch(data, var0(4), 0x7FFFFFFF), "past the end")  # rank
    _rejects(_patch(data, var0(12), 0x07, "<B"), "type code 7")
    _rejects(_patch(data, var0(14), 0x01, "<B"), "nonzero padding")
    _rejects(_patch(data, var0(16), -100, "<i"), "buffer 99 out of range")
    _rejects(_patch(data, lambda f: f.slot(f.h["sbuf"]), 16), "buffer 0 holds 16")
    _rejects(_patch(data, fn0(0), 0xFFFF, "<H"), "function id 65535")
    _rejects(_patch(data, fn0(0), 360, "<H"), "function id 360")  # Trilu is level 45
    _rejects(_patch(data, fn0(4), 1 << 20), "past the end")  # number of inputs
    # Convolution arguments: base_axis at 20, pad {int32 size, slot} at 24, ..., channel_last at 52
    _rejects(_patch(data, fn0(24), 0x10000000), "past the end")
    _rejects(_patch(data, fn0(24), -1, "<i"), "negative size")
    _rejects(_patch(data, fn0(53), 1, "<B"), "nonzero padding")


def test_single_byte_corruptions_never_escape(nets: tuple[Path, dict]) -> None:
    """Any byte flipped: the file is rejected with a qcc error or parses into something the
    writer accepts and that reads back identically."""
    data = _load(nets, "mlp-v2-api44")
    accepted = 0
    for i in range(len(data)):
        for flip in (0xFF, 0x01, 0x80):
            bad = bytearray(data)
            bad[i] ^= flip
            try:
                nnb = read_nnb(bytes(bad), "bad.nnb")
            except (InvalidInputError, UnsupportedError) as e:
                assert "bad.nnb" in str(e)
                continue
            accepted += 1
            assert read_nnb(write_nnb(nnb), "again") == nnb
    assert 0 < accepted < 3 * len(data)


# ----------------------------------------------------------------------------- function table


def test_committed_table_is_nnablas_table() -> None:
    from qcc.backends.nnb import gen_function_table as gen

    levels, arguments, version = gen.extract()
    committed = nnbfun.committed_table()
    assert committed.api_levels == levels and committed.arguments == arguments
    assert gen.TARGET.read_text() == gen.render(levels, arguments, version)
    installed = nnbfun.installed_table()
    assert installed is not None
    assert installed.api_levels == levels and installed.arguments == arguments


@pytest.mark.parametrize("level", [44, 45])
def test_table_resolves_levels_like_nnabla(level: int) -> None:
    import nnabla.utils.converter as conv

    api = conv.get_api_level_info()
    api.set_api_level(level)
    table = nnbfun.committed_table()
    resolved = table.functions(level)
    assert set(resolved) == set(api.get_function_list())
    for name, spec in resolved.items():
        assert (spec.id, spec.argfmt) == (api.get_func_id(name), api.get_argument_code(name))
        assert table.by_id(spec.id, level) == spec
    assert table.by_id(1, level) is not None  # the old Convolution id still decodes
    trilu = "Trilu" in api.get_function_list()
    if not trilu:
        with pytest.raises(UnsupportedError, match="Trilu"):
            table.spec("Trilu", level)
    with pytest.raises(UnsupportedError, match="FusedConvolution"):
        table.spec("FusedConvolution", level)


def test_table_falls_back_to_committed_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nnbfun.importlib.util, "find_spec", lambda name: None)
    assert nnbfun.installed_table() is None
    nnbfun.default_table.cache_clear()
    try:
        assert "committed" in nnbfun.default_table().source
    finally:
        nnbfun.default_table.cache_clear()


def test_runtime_lists_name_real_functions() -> None:
    table = nnbfun.committed_table()
    assert nnbfun.RUNTIME_FIXED_POINT <= nnbfun.RUNTIME_IMPLEMENTED <= set(table.arguments)
    assert {"Einsum", "AddN", "Trilu"}.isdisjoint(nnbfun.RUNTIME_IMPLEMENTED)
    assert nnbf.payload_size(DataType.SIGN, 9) == 2
