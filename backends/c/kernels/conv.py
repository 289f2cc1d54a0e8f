"""Convolution and Dense kernels in every numeric mode: packed weights, blocked loops, fused epilogues.

Weights are constants, so qcc re-packs them when it writes the model (`pack_conv_weights`,
`pack_dense_weights`): per group, output channels in blocks of QCC_OB (16), each block stored
tap by tap, `[k][16]`, zero-padded to a whole block. At run time a convolution walks tiles of
QCC_PB output positions (flattened over the output map, so small maps waste nothing), copies the
taps of the tile into a panel `[k][QCC_PB]` (a zero, or the real zero, where the window leaves the
input) QCC_KC taps at a time, and a micro-kernel adds panel x weights into QCC_PB x 16
accumulators. Its inner loop runs over the 16 output channels with a fixed length: compilers
vectorize it (a broadcast multiply-add, FMA when the target has it, int32 multiply-add for the
integer modes) and keep the accumulators in registers. The epilogue adds the bias and applies
what the lowering fused into the layer (`Epilogue`: BatchNorm and activations in float,
requantization and the lookup table in affine, the dedicated Relu in fixed point).

Integer sums are exact in any order (the modes check their bounds), so the affine mode
(`qcc.sim.affine_int`) sums the taps in whatever order the loops run. nnabla-c-runtime's fixed
point is not associative: it sums one input channel's taps, truncates, then adds to a saturated
running total, channel by channel (`qcc.sim.fixed.conv_kernel`); its panel therefore holds whole
input channels in order and its micro-kernel keeps both the channel sums and the totals. Depthwise
convolutions (one input and one output channel per group) run along output rows instead.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import numpy as np
from qcc.backends.c.ctype import FLOAT, CType
from qcc.backends.c.kernels.helpers import KernelSet

OB = 16
"""Output channels per packed weight block: the length of the micro-kernel's inner loop."""
PB = 8
"""Output positions per tile: the micro-kernel's accumulators are PB rows of OB."""
KC = 256
"""Taps per panel (the panel is KC x PB elements on the stack)."""
OS = 64
"""Output channels whose sums a tile keeps while its taps are packed (OS x PB accumulators)."""
ROW = 32
"""Output positions per row chunk of the depthwise kernel."""


# ---------------------------------------------------------------- weight layout (compile time)


def pack_conv_weights(w: np.ndarray, group: int, channel_major: bool = False) -> np.ndarray:
    """OIHW weights -> per group, blocks of OB output channels, each `[k][OB]`.

    k runs over (ky, kx, input channel) (tap-major, what the float and affine panels hold), or
    with `channel_major` over (input channel, ky, kx) (fixed point sums channel by channel).
    """
    o, cg, kh, kw = w.shape
    og = o // group
    blocks = -(-og // OB)
    per = w.reshape(group, og, cg, kh, kw)
    per = per.reshape(group, og, cg * kh * kw) if channel_major else \
        per.transpose(0, 1, 3, 4, 2).reshape(group, og, kh * kw * cg)
    padded = np.zeros((group, blocks * OB, per.shape[2]), dtype=w.dtype)
    padded[:, :og] = per
    return padded.reshape(group, blocks, OB, -1).transpose(0, 1, 3, 2).reshape(-1)


def pack_dense_weights(w: np.ndarray) -> np.ndarray:
    """(K, M) weights -> blocks of OB output columns, each `[k][OB]`."""
    k, m = w.shape
    blocks = -(-m // OB)
    padded = np.zeros((k, blocks * OB), dtype=w.dtype)
    padded[:, :m] = w
    return padded.reshape(k, blocks, OB).transpose(1, 0, 2).reshape(-1)


def is_depthwise(w_shape: tuple[int, ...], group: int) -> bool:
    """One input and one output channel per group: the row kernel, not the packed one."""
    return group > 1 and w_shape[0] == group and w_shape[1] == 1


# ---------------------------------------------------------------- epilogues


@attrs.frozen
class Epilogue:
    """What a Conv/Dense kernel does with each sum `v` before storing `r`: C statements once per
    output channel `oc` (`channel`) and per element (`element`, reading `v`, leaving `r`), the
    parameters they read, the helpers they call and the kernel-name suffix that tells them apart."""

    suffix: str
    params: tuple[str, ...]
    channel: str
    element: str
    helpers: tuple[str, ...] = ()

    def then(self, suffix: str, params: tuple[str, ...], channel: str, element: str,
             helpers: tuple[str, ...] = ()) -> Epilogue:
        return Epilogue(self.suffix + suffix, self.params + params, self.channel + channel,
                        self.element + element, self.helpers + helpers)


def float_epilogue() -> Epilogue:
    return Epilogue("", (), "const float bo = b != NULL ? b[oc] : 0.0f;\n", "float r = v + bo;\n")


def with_batchnorm(ep: Epilogue) -> Epilogue:
    """BatchNorm as the unfused kernel computes it: ((r - mean) * gamma) / std + beta."""
    return ep.then("_bn", ("const float *bn_mean", "const float *bn_gamma", "const float *bn_beta",
                           "const float *bn_std"),
                   "const float bm = bn_mean[oc];\nconst float bg = bn_gamma[oc];\n"
                   "const float bb = bn_beta[oc];\nconst float bs = bn_std[oc];\n",
                   "r = r - bm;\nr = r * bg;\nr = r / bs;\nr = r + bb;\n")


def with_unary(ep: Epilogue, op: str, stmts: str, params: tuple[str, ...], helpers: tuple[str, ...]) -> Epilogue:
    """A float32 one-input activation (kernels.elementwise.UNARY statements: `v` in, `r` out)."""
    return ep.then(f"_{op.lower()}", tuple(f"float {p}" for p in params), "",
                   f"{{\nconst float v = r;\n{stmts}\n}}\n", helpers)


def affine_epilogue(y: CType) -> Epilogue:
    """The bias on the accumulator scale, then the per-channel requantization (qcc.sim.affine_int)."""
    return Epilogue("", ("int32_t zy",), "const int32_t bo = bias[oc];\nconst int32_t mo = mult[oc];\n"
                    "const int so = shift[oc];\n",
                    f"int32_t r = qcc_requant((int64_t)v + bo, mo, so, zy, {y.lo}, {y.hi});\n", ("requant",))


def with_table(ep: Epilogue, x: CType, y: CType) -> Epilogue:
    """An affine one-input op's lookup table applied to the requantized value."""
    return ep.then(f"_t{y.suffix}", (f"const {y.name} *tab",), "", f"r = tab[r - ({x.lo})];\n")


def fixed_epilogue(y: CType) -> Epilogue:
    """The runtime's saturating bias add (bias already at the output's position)."""
    return Epilogue("", (), f"const {y.name} bo = b != NULL ? b[oc] : 0;\n",
                    f"int32_t r = v;\nif (b != NULL) {{\n    r = qcc_sat_add(r, bo, {y.bits});\n}}\n", ("sat_add",))


def with_fixed_relu(ep: Epilogue, y: CType) -> Epilogue:
    """The dedicated fixed-point Relu: max(r, 0), then moved to the Relu's position."""
    return ep.then("_relu", ("int relu_shift",), "",
                   f"r = r > 0 ? r : 0;\nr = qcc_sat(qcc_shift(r, relu_shift), {y.lo}, {y.hi});\n", ("sat", "shift"))


# ---------------------------------------------------------------- shared pieces


def _tile_params(ks: KernelSet) -> None:
    ks.helper("conv_t")


def _indent(text: str, spaces: int) -> str:
    pad = " " * spaces
    return "".join(pad + line + "\n" if line else "\n" for line in text.splitlines())


def pack(ks: KernelSet, x: CType, panel: str, centered: bool) -> str:
    """The panel of one tile: taps (ky, kx, input channel) k0 .. k0 + kc - 1, PB positions each.

    Per tap the positions' offsets are computed once and serve every input channel: a run of PB
    consecutive inputs (stride 1, inside the map) is a fixed-length copy; `centered` stores x - zx
    (affine: the padding is then 0, the real zero)."""
    name = f"qcc_pack_{x.suffix}{'_c' if centered else ''}"
    value = "(int16_t)((int32_t)xc[J] - zx)" if centered else "xc[J]"

    def load(index: str) -> str:
        return value.replace("J", index)

    extra = ", int32_t zx" if centered else ""
    return ks.kernel(name, lambda: f"""
/* panel[k][q] = x at tap (ky, kx), input channel ic of output position q, for k0 <= k < k0 + kc
   with k = (ky * kw + kx) * cg + ic; positions outside the input (or past the map) read 0. */
static void {name}(const {x.name} *restrict x, {panel} *restrict panel, const qcc_conv_t *restrict p,
    const int *restrict iy0, const int *restrict ix0, long k0, long kc{extra})
{{
    const int cg = p->c / p->group;
    const long hw = (long)p->h * p->w;
    int tap = (int)(k0 / cg);
    int ic = (int)(k0 % cg);
    long k = 0;
    while (k < kc) {{
        const int dy = tap / p->kw * p->dh;
        const int dx = tap % p->kw * p->dw;
        const int n = (int)(cg - ic < kc - k ? cg - ic : kc - k);
        long off[QCC_PB];
        int q, j, inside = 1, run;
        for (q = 0; q < QCC_PB; ++q) {{
            const int iy = iy0[q] + dy;
            const int ix = ix0[q] + dx;
            off[q] = iy >= 0 && iy < p->h && ix >= 0 && ix < p->w ? (long)iy * p->w + ix : -1;
            inside &= off[q] >= 0;
        }}
        run = inside;
        for (q = 1; q < QCC_PB; ++q) {{
            run &= off[q] == off[0] + q;
        }}
        for (j = 0; j < n; ++j) {{
            const {x.name} *restrict xc = x + (long)(ic + j) * hw;
            {panel} *restrict pk = panel + (k + j) * QCC_PB;
            if (run) {{
                for (q = 0; q < QCC_PB; ++q) {{
                    pk[q] = {load("off[0] + q")};
                }}
            }} else {{
                for (q = 0; q < QCC_PB; ++q) {{
                    pk[q] = off[q] >= 0 ? {load("off[q]")} : 0;
                }}
            }}
        }}
        k += n;
        ic = 0;
        ++tap;
    }}
}}
""", ("conv_t",))


def micro(ks: KernelSet, panel: str, w: CType, acc: str) -> str:
    """acc[q][o] += panel[k][q] * w[k][o] for every tap k of the panel: QCC_PB rows of OB accumulators,
    the inner loop over o (one body per supported QCC_PB, chosen by the preprocessor)."""
    name = f"qcc_tile_{_short(panel)}_{w.suffix}"

    def body(pb: int) -> str:
        rows = range(pb)
        decl = " ".join(f"{acc} a{q}[QCC_OB];" for q in rows)
        load = "\n".join(f"        a{q}[o] = acc[{q} * QCC_OB + o];" for q in rows)
        store = "\n".join(f"        acc[{q} * QCC_OB + o] = a{q}[o];" for q in rows)
        xs = "\n".join(f"        const {acc} x{q} = pk[{q}];" for q in rows)
        mac = "\n".join(f"            a{q}[o] += x{q} * wk[o];" for q in rows)
        return f"""    {decl}
    long k;
    int o;
    for (o = 0; o < QCC_OB; ++o) {{
{load}
    }}
    for (k = 0; k < kc; ++k) {{
        const {panel} *restrict pk = panel + k * QCC_PB;
        const {w.name} *restrict wk = w + k * QCC_OB;
{xs}
        for (o = 0; o < QCC_OB; ++o) {{
{mac}
        }}
    }}
    for (o = 0; o < QCC_OB; ++o) {{
{store}
    }}
"""
    return ks.kernel(name, lambda: f"""
/* acc[q][o] += panel[k][q] * w[k][o]: the accumulators in registers, a fixed-length inner loop. */
static void {name}(const {panel} *restrict panel, const {w.name} *restrict w, long kc, {acc} *restrict acc)
{{
{_per_rows(body)}}}
""", ("conv_t",))


ROWS = (2, 3, 4, 6, 8)
"""The QCC_PB values the micro-kernels are written for (helpers picks one per instruction set)."""


def _per_rows(body: Callable[[int], str]) -> str:
    """One function body per supported QCC_PB, selected by the preprocessor."""
    parts = [f"#{'if' if i == 0 else 'elif'} QCC_PB == {pb}\n{body(pb)}" for i, pb in enumerate(ROWS)]
    return "".join(parts) + "#else\n#error \"QCC_PB must be one of " + ", ".join(map(str, ROWS)) + "\"\n#endif\n"


def _short(ctype: str) -> str:
    return {"float": "f32", "int8_t": "i8", "int16_t": "i16", "uint8_t": "u8", "int32_t": "i32"}[ctype]


def _tiles(prologue: str, body: str) -> str:
    """The tile walk every packed convolution shares: batch, group, output-channel superblock of
    QCC_OS channels, tile of QCC_PB flattened output positions (iy0/ix0: each position's window
    corner, far outside for positions past the map); `body` fills `part` and stores the tile."""
    return f"""{{
    const int cg = p->c / p->group;
    const int og = p->o / p->group;
    const long npix = (long)p->oh * p->ow;
    const long kk = (long)cg * p->kh * p->kw;
    const int nob = (og + QCC_OB - 1) / QCC_OB;
    int iy0[QCC_PB], ix0[QCC_PB];
    int n, g, ob0, q, j, o;
    long p0;
{prologue}    for (n = 0; n < p->n; ++n) {{
        for (g = 0; g < p->group; ++g) {{
            const long xoff = ((long)n * p->c + (long)g * cg) * p->h * p->w;
            for (ob0 = 0; ob0 < nob; ob0 += QCC_OS / QCC_OB) {{
                const int nb = nob - ob0 < QCC_OS / QCC_OB ? nob - ob0 : QCC_OS / QCC_OB;
                for (p0 = 0; p0 < npix; p0 += QCC_PB) {{
                    const int pn = npix - p0 < QCC_PB ? (int)(npix - p0) : QCC_PB;
                    for (q = 0; q < QCC_PB; ++q) {{
                        const long pq = p0 + q;
                        iy0[q] = q < pn ? (int)(pq / p->ow) * p->sh - p->ph : -(1 << 29);
                        ix0[q] = q < pn ? (int)(pq % p->ow) * p->sw - p->pw : -(1 << 29);
                    }}
{_indent(body, 20)}                }}
            }}
        }}
    }}
}}
"""


def _store(ep: Epilogue, y: CType, part: str) -> str:
    """The epilogue over one tile: per output channel its parameters, per position its value."""
    return f"""for (j = 0; j < nb; ++j) {{
    for (o = 0; o < QCC_OB && (ob0 + j) * QCC_OB + o < og; ++o) {{
        const int oc = g * og + (ob0 + j) * QCC_OB + o;
        {y.name} *restrict yo = y + ((long)n * p->o + oc) * npix + p0;
{_indent(ep.channel, 8)}        for (q = 0; q < pn; ++q) {{
            const {part} v = part[(j * QCC_PB + q) * QCC_OB + o];
{_indent(ep.element, 12)}            yo[q] = ({y.name})r;
        }}
    }}
}}
"""


# ---------------------------------------------------------------- float and affine convolution


def conv_float(ks: KernelSet, ep: Epilogue) -> str:
    return _conv_mac(ks, FLOAT, FLOAT, FLOAT, ep, f"qcc_conv_f32{ep.suffix}", "float", "float", "")


def conv_affine(ks: KernelSet, x: CType, w: CType, y: CType, ep: Epilogue) -> str:
    """Sums of (x - zx) * w (int16 panel, int32 accumulators); the bias and requantization in the epilogue."""
    name = f"qcc_conv_{x.suffix}_{w.suffix}_{y.suffix}{ep.suffix}"
    return _conv_mac(ks, x, w, y, ep, name, "int16_t", "int32_t", ", int32_t zx, const int32_t *restrict bias, "
                     "const int32_t *restrict mult, const int32_t *restrict shift")


def _conv_mac(ks: KernelSet, x: CType, w: CType, y: CType, ep: Epilogue, name: str, panel: str, acc: str,
              extra: str) -> str:
    centered = x.affine is not None
    packer = pack(ks, x, panel, centered)
    tile = micro(ks, panel, w, acc)
    for helper in ep.helpers:
        ks.helper(helper)
    bias = "" if centered else f", const {y.name} *restrict b"
    params = "".join(f", {p}" for p in ep.params)
    zero = "0.0f" if acc == "float" else "0"
    body = f"""for (j = 0; j < nb * QCC_PB * QCC_OB; ++j) {{
    part[j] = {zero};
}}
for (k0 = 0; k0 < kk; k0 += QCC_KC) {{
    const long kc = kk - k0 < QCC_KC ? kk - k0 : QCC_KC;
    {packer}(x + xoff, panel, p, iy0, ix0, k0, kc{', zx' if centered else ''});
    for (j = 0; j < nb; ++j) {{
        {tile}(panel, w + ((long)(g * nob + ob0 + j) * kk + k0) * QCC_OB, kc, part + j * QCC_PB * QCC_OB);
    }}
}}
""" + _store(ep, y, acc)
    prologue = f"""    {panel} panel[QCC_KC * QCC_PB];
    {acc} part[QCC_OS * QCC_PB];
    long k0;
"""
    return ks.kernel(name, lambda: f"""
static void {name}(const {x.name} *restrict x, const {w.name} *restrict w{bias}, {y.name} *restrict y,
    const qcc_conv_t *restrict p{extra}{params})
""" + _tiles(prologue, body), ("conv_t",))


# ---------------------------------------------------------------- fixed-point convolution


def fixed_sum_type(x: CType, w: CType, y: CType, taps: int, shift: int) -> str:
    """int32 when one input channel's sum plus a stored output cannot overflow it (and the
    truncating shift is narrower than 32 bits), else int64."""
    worst = (1 << (x.bits - 1)) * (1 << (w.bits - 1)) * taps + (1 << (y.bits - 1))
    return "int32_t" if worst < 2**31 and shift < 31 else "int64_t"


def conv_fixed(ks: KernelSet, x: CType, w: CType, y: CType, ep: Epilogue, taps: int, shift: int) -> str:
    """nnabla-c-runtime's convolution (qcc.sim.fixed.conv_kernel) on channel-major panels: per input
    channel the exact sum of its taps, truncated toward zero by 2^shift (`upscale`: multiplied by
    2^-shift), added to the running total saturated to the output type; then the epilogue."""
    sum_t = fixed_sum_type(x, w, y, taps, shift)
    upscale = shift < 0
    cap = max(KC, taps)
    flavour = f"{'_s64' if sum_t == 'int64_t' else ''}{'_up' if upscale else ''}{'' if cap == KC else f'_k{cap}'}"
    name = f"qcc_conv_{x.suffix}_{w.suffix}_{y.suffix}{flavour}{ep.suffix}"
    packer = _pack_channels(ks, x, cap)
    tile = _micro_fixed(ks, x, w, y, sum_t, upscale)
    for helper in ep.helpers:
        ks.helper(helper)
    params = "".join(f", {p}" for p in ep.params)
    body = f"""for (j = 0; j < nb * QCC_PB * QCC_OB; ++j) {{
    part[j] = 0;
}}
for (c0 = 0; c0 < cg; c0 += per) {{
    const int nc = cg - c0 < per ? cg - c0 : per;
    {packer}(x + xoff + (long)c0 * p->h * p->w, panel, p, iy0, ix0, nc);
    for (j = 0; j < nb; ++j) {{
        {tile}(panel, w + ((long)(g * nob + ob0 + j) * kk + (long)c0 * khw) * QCC_OB, nc, khw,
            part + j * QCC_PB * QCC_OB, rs, ls);
    }}
}}
""" + _store(ep, y, "int32_t")
    prologue = f"""    const int khw = p->kh * p->kw;
    const int per = {cap} / khw;
    const int rs = shift > 0 ? shift : 0;
    const int32_t ls = shift < 0 ? (int32_t)1 << -shift : 1;
    {x.name} panel[{cap} * QCC_PB];
    int32_t part[QCC_OS * QCC_PB];
    int c0;
"""
    return ks.kernel(name, lambda: f"""
static void {name}(const {x.name} *restrict x, const {w.name} *restrict w, const {y.name} *restrict b,
    {y.name} *restrict y, const qcc_conv_t *restrict p, int shift{params})
""" + _tiles(prologue, body), ("conv_t",))


def _pack_channels(ks: KernelSet, x: CType, cap: int) -> str:
    name = f"qcc_pack_{x.suffix}_ch"
    return ks.kernel(name, lambda: f"""
/* panel[(ic * kh + ky) * kw + kx][q] for input channels 0 .. nc - 1 (channel-major: fixed point
   sums one channel's taps at a time); outside the input reads 0. */
static void {name}(const {x.name} *restrict x, {x.name} *restrict panel, const qcc_conv_t *restrict p,
    const int *restrict iy0, const int *restrict ix0, int nc)
{{
    const long hw = (long)p->h * p->w;
    const int khw = p->kh * p->kw;
    int t, q, ic;
    for (t = 0; t < khw; ++t) {{
        const int dy = t / p->kw * p->dh;
        const int dx = t % p->kw * p->dw;
        long off[QCC_PB];
        for (q = 0; q < QCC_PB; ++q) {{
            const int iy = iy0[q] + dy;
            const int ix = ix0[q] + dx;
            off[q] = iy >= 0 && iy < p->h && ix >= 0 && ix < p->w ? (long)iy * p->w + ix : -1;
        }}
        for (ic = 0; ic < nc; ++ic) {{
            const {x.name} *restrict xc = x + ic * hw;
            {x.name} *restrict pk = panel + ((long)ic * khw + t) * QCC_PB;
            for (q = 0; q < QCC_PB; ++q) {{
                pk[q] = off[q] >= 0 ? xc[off[q]] : 0;
            }}
        }}
    }}
}}
""", ("conv_t",))


def _micro_fixed(ks: KernelSet, x: CType, w: CType, y: CType, sum_t: str, upscale: bool) -> str:
    name = f"qcc_tile_{x.suffix}_{w.suffix}_{y.suffix}{'_s64' if sum_t == 'int64_t' else ''}{'_up' if upscale else ''}"
    unsigned = "uint32_t" if sum_t == "int32_t" else "uint64_t"
    wide = "int64_t" if upscale or sum_t == "int64_t" else "int32_t"
    scale = " * ls" if upscale else ""

    def body(pb: int) -> str:
        rows = range(pb)
        decl = " ".join(f"int32_t t{q}[QCC_OB]; {sum_t} s{q}[QCC_OB];" for q in rows)
        load = "\n".join(f"        t{q}[o] = acc[{q} * QCC_OB + o];" for q in rows)
        store = "\n".join(f"        acc[{q} * QCC_OB + o] = t{q}[o];" for q in rows)
        clear = "\n".join(f"            s{q}[o] = 0;" for q in rows)
        xs = "\n".join(f"            const {sum_t} x{q} = pk[{q}];" for q in rows)
        mac = "\n".join(f"                s{q}[o] += x{q} * wk[o];" for q in rows)
        flush = "\n".join(f"""            {{
                const {sum_t} v = s{q}[o];
                const {sum_t} m = ({sum_t})(({unsigned})(v < 0 ? -v : v) >> rs);
                const {wide} r = ({wide})(v < 0 ? -m : m){scale} + t{q}[o];
                t{q}[o] = (int32_t)(r < {y.lo} ? {y.lo} : (r > {y.hi} ? {y.hi} : r));
            }}""" for q in rows)
        return f"""    {decl}
    int ic, t, o;
    for (o = 0; o < QCC_OB; ++o) {{
{load}
    }}
    for (ic = 0; ic < nc; ++ic) {{
        for (o = 0; o < QCC_OB; ++o) {{
{clear}
        }}
        for (t = 0; t < khw; ++t) {{
            const {x.name} *restrict pk = panel + ((long)ic * khw + t) * QCC_PB;
            const {w.name} *restrict wk = w + ((long)ic * khw + t) * QCC_OB;
{xs}
            for (o = 0; o < QCC_OB; ++o) {{
{mac}
            }}
        }}
        for (o = 0; o < QCC_OB; ++o) {{
{flush}
        }}
    }}
    for (o = 0; o < QCC_OB; ++o) {{
{store}
    }}
"""
    return ks.kernel(name, lambda: f"""
/* For each of nc input channels: s = the exact sum of its khw taps; t = sat(t + trunc(s / 2^rs){scale}). */
static void {name}(const {x.name} *restrict panel, const {w.name} *restrict w, int nc, int khw,
    int32_t *restrict acc, int rs, int32_t ls)
{{
    (void)ls;
{_per_rows(body)}}}
""", ("conv_t",))


# ---------------------------------------------------------------- depthwise convolution


def depthwise(ks: KernelSet, x: CType, w: CType, y: CType, ep: Epilogue, mode: str, taps: int = 1,
              shift: int = 0) -> str:
    """One input channel per output channel: along each output row, QCC_ROW positions at a time
    in a fixed-length loop; the window's row is copied (zero-padded, strided) once per tap row.

    `mode` float / affine (sums of x - zx) / fixed (one channel's sum, truncated and saturated once)."""
    fixed = mode == "fixed"
    upscale = shift < 0
    sum_t = fixed_sum_type(x, w, y, taps, shift) if fixed else ("float" if mode == "float" else "int32_t")
    flavour = f"{'_s64' if sum_t == 'int64_t' else ''}{'_up' if upscale else ''}" if fixed else ""
    name = f"qcc_dwconv_{x.suffix}_{w.suffix}_{y.suffix}{flavour}{ep.suffix}" if mode != "float" else \
        f"qcc_dwconv_f32{ep.suffix}"
    for helper in ep.helpers:
        ks.helper(helper)
    elem = "float" if mode == "float" else ("int16_t" if mode == "affine" else x.name)
    value = "(int16_t)((int32_t)xr[ix] - zx)" if mode == "affine" else "xr[ix]"
    if mode == "affine":
        extra = ", int32_t zx, const int32_t *restrict bias, const int32_t *restrict mult, const int32_t *restrict shift"
        bias_param = ""
    elif fixed:
        extra = ", int shift"
        bias_param = f", const {y.name} *restrict b"
    else:
        extra = ""
        bias_param = ", const float *restrict b"
    if fixed:
        unsigned = "uint32_t" if sum_t == "int32_t" else "uint64_t"
        wide = "int64_t" if upscale or sum_t == "int64_t" else "int32_t"
        finish = f"""const {sum_t} m = ({sum_t})(({unsigned})(acc[q] < 0 ? -acc[q] : acc[q]) >> rs);
const {wide} t = ({wide})(acc[q] < 0 ? -m : m){' * ls' if upscale else ''};
const int32_t v = (int32_t)(t < {y.lo} ? {y.lo} : (t > {y.hi} ? {y.hi} : t));
"""
        prologue = ("const int rs = shift > 0 ? shift : 0;\n    const int32_t ls = shift < 0 ? (int32_t)1 << -shift : 1;\n"
                    "    (void)ls;\n    ")
    else:
        finish = f"const {sum_t} v = acc[q];\n"
        prologue = ""
    zero = "0.0f" if sum_t == "float" else "0"
    return ks.kernel(name, lambda: f"""
static void {name}(const {x.name} *restrict x, const {w.name} *restrict w{bias_param}, {y.name} *restrict y,
    const qcc_conv_t *restrict p{extra}{''.join(f', {p}' for p in ep.params)})
{{
    {prologue}const int khw = p->kh * p->kw;
    int n, oc, oy, ox0, ky, kx, q;
    for (n = 0; n < p->n; ++n) {{
        for (oc = 0; oc < p->o; ++oc) {{
            const {x.name} *restrict xp = x + ((long)n * p->c + oc) * p->h * p->w;
            const {w.name} *restrict wc = w + (long)oc * khw;
{_indent(ep.channel, 12)}            for (oy = 0; oy < p->oh; ++oy) {{
                {y.name} *restrict yr = y + (((long)n * p->o + oc) * p->oh + oy) * p->ow;
                for (ox0 = 0; ox0 < p->ow; ox0 += QCC_ROW) {{
                    const int pn = p->ow - ox0 < QCC_ROW ? p->ow - ox0 : QCC_ROW;
                    {sum_t} acc[QCC_ROW];
                    for (q = 0; q < QCC_ROW; ++q) {{
                        acc[q] = {zero};
                    }}
                    for (ky = 0; ky < p->kh; ++ky) {{
                        const int iy = oy * p->sh - p->ph + ky * p->dh;
                        const {x.name} *restrict xr;
                        if (iy < 0 || iy >= p->h) {{
                            continue;
                        }}
                        xr = xp + (long)iy * p->w;
                        for (kx = 0; kx < p->kw; ++kx) {{
                            const {sum_t} wv = wc[ky * p->kw + kx];
                            const int ix0 = ox0 * p->sw - p->pw + kx * p->dw;
                            {elem} row[QCC_ROW];
                            if (ix0 >= 0 && ix0 + (QCC_ROW - 1) * p->sw < p->w) {{
                                for (q = 0; q < QCC_ROW; ++q) {{
                                    const int ix = ix0 + q * p->sw;
                                    row[q] = {value};
                                }}
                            }} else {{
                                for (q = 0; q < QCC_ROW; ++q) {{
                                    const int ix = ix0 + q * p->sw;
                                    row[q] = ix >= 0 && ix < p->w ? {value} : 0;
                                }}
                            }}
                            for (q = 0; q < QCC_ROW; ++q) {{
                                acc[q] += row[q] * wv;
                            }}
                        }}
                    }}
                    for (q = 0; q < pn; ++q) {{
{_indent(finish, 24)}{_indent(ep.element, 24)}                        yr[ox0 + q] = ({y.name})r;
                    }}
                }}
            }}
        }}
    }}
}}
""", ("conv_t",))


# ---------------------------------------------------------------- dense


def dense(ks: KernelSet, x: CType, w: CType, y: CType, ep: Epilogue, mode: str) -> str:
    """y = x (n, k) @ w (k, m), w packed in blocks of OB columns; four partial sums per column
    (k mod 4) keep four independent chains. Fixed point truncates the whole exact sum once."""
    if mode == "float":
        name, acc, value = f"qcc_dense_f32{ep.suffix}", "float", "xi[t]"
        extra, bias_param, finish = "", ", const float *restrict b", ""
    elif mode == "affine":
        name, acc, value = f"qcc_dense_{x.suffix}_{w.suffix}_{y.suffix}{ep.suffix}", "int32_t", "((int32_t)xi[t] - zx)"
        extra = ", int32_t zx, const int32_t *restrict bias, const int32_t *restrict mult, const int32_t *restrict shift"
        bias_param, finish = "", ""
    else:
        name, acc, value = f"qcc_dense_{x.suffix}_{w.suffix}_{y.suffix}{ep.suffix}", "int64_t", "(int64_t)xi[t]"
        extra, bias_param = ", int shift", f", const {y.name} *restrict b"
        finish = "sum = qcc_sat(qcc_shift(sum, shift), LO, HI);\n".replace("LO", str(y.lo)).replace("HI", str(y.hi))
        ks.helper("sat")
        ks.helper("shift")
    for helper in ep.helpers:
        ks.helper(helper)
    sum_t = "float" if mode == "float" else "int64_t" if mode == "fixed" else "int32_t"
    v_t = "float" if mode == "float" else "int32_t"
    return ks.kernel(name, lambda: f"""
static void {name}(const {x.name} *restrict x, const {w.name} *restrict w{bias_param}, {y.name} *restrict y,
    long n, long k, long m{extra}{''.join(f', {p}' for p in ep.params)})
{{
    const long nob = (m + QCC_OB - 1) / QCC_OB;
    const long k4 = k - k % 4;
    long i, ob, t;
    int o, u;
    for (i = 0; i < n; ++i) {{
        const {x.name} *restrict xi = x + i * k;
        for (ob = 0; ob < nob; ++ob) {{
            const {w.name} *restrict wb = w + ob * k * QCC_OB;
            {acc} a[4][QCC_OB];
            for (u = 0; u < 4; ++u) {{
                for (o = 0; o < QCC_OB; ++o) {{
                    a[u][o] = 0;
                }}
            }}
            for (t = 0; t < k4; t += 4) {{
                for (u = 0; u < 4; ++u) {{
                    const {acc} xv = {value.replace("[t]", "[t + u]")};
                    const {w.name} *restrict wk = wb + (t + u) * QCC_OB;
                    for (o = 0; o < QCC_OB; ++o) {{
                        a[u][o] += xv * wk[o];
                    }}
                }}
            }}
            for (t = k4; t < k; ++t) {{
                const {acc} xv = {value};
                const {w.name} *restrict wk = wb + t * QCC_OB;
                for (o = 0; o < QCC_OB; ++o) {{
                    a[0][o] += xv * wk[o];
                }}
            }}
            for (o = 0; o < QCC_OB && ob * QCC_OB + o < m; ++o) {{
                const long oc = ob * QCC_OB + o;
                {sum_t} sum = a[0][o] + a[1][o];
                {v_t} v;
                sum += a[2][o] + a[3][o];
{_indent(finish, 16)}                v = ({v_t})sum;
                {{
{_indent(ep.channel, 20)}{_indent(ep.element, 20)}                    y[i * m + oc] = ({y.name})r;
                }}
            }}
        }}
    }}
}}
""", ("conv_t",))
