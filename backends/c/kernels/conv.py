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
KC = 128
"""Taps per float panel (QCC_KC; the panel is KC x OB elements on the stack)."""
OS = 64
"""Output channels whose sums a tile keeps while its taps are packed (OS x PB accumulators)."""
ROW = 32
"""Output positions per row chunk of the depthwise kernel."""


# ---------------------------------------------------------------- weight layout (compile time)


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
    post: str = ""
    """Statements on `r` that do not vectorize (a table lookup), run where the value is stored."""

    def then(self, suffix: str, params: tuple[str, ...], channel: str, element: str,
             helpers: tuple[str, ...] = ()) -> Epilogue:
        return Epilogue(self.suffix + suffix, self.params + params, self.channel + channel,
                        self.element + element, self.helpers + helpers, self.post)

    @property
    def full(self) -> str:
        return self.element + self.post


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


def with_residual(ep: Epilogue) -> Epilogue:
    """A residual Add fused into the tiled float kernel (`conv_float`): its other operand, shaped like
    the output, added where each value is stored (a tile's last positions may lie past the map), so
    the sum is neither copied nor read again by an Add and a Relu of their own."""
    return attrs.evolve(ep, suffix=f"{ep.suffix}_add", params=(*ep.params, "const float *skip"),
                        channel=f"{ep.channel}const float *sk = skip + ((long)n * p->o + oc) * npix + p0;\n",
                        post=f"{ep.post}r = r + sk[j];\n")


def with_stored_unary(ep: Epilogue, op: str, stmts: str, params: tuple[str, ...],
                      helpers: tuple[str, ...]) -> Epilogue:
    """`with_unary` where each value is stored: after a fused residual Add."""
    return attrs.evolve(ep, suffix=f"{ep.suffix}_{op.lower()}", params=(*ep.params, *(f"float {p}" for p in params)),
                        post=f"{ep.post}{{\nconst float v = r;\n{stmts}\n}}\n", helpers=ep.helpers + helpers)


def affine_epilogue(y: CType) -> Epilogue:
    """The bias on the accumulator scale, then the per-channel requantization (qcc.sim.affine_int)."""
    return Epilogue("", ("int32_t zy",), "const int32_t bo = bias[oc];\nconst int32_t mo = mult[oc];\n"
                    "const int so = shift[oc];\n",
                    f"int32_t r = qcc_requant((int64_t)v + bo, mo, so, zy, {y.lo}, {y.hi});\n", ("requant",))


def with_table(ep: Epilogue, x: CType, y: CType) -> Epilogue:
    """An affine one-input op's lookup table applied to the requantized value."""
    return attrs.evolve(ep, suffix=f"{ep.suffix}_t{y.suffix}", params=(*ep.params, f"const {y.name} *tab"),
                        post=f"{ep.post}r = tab[r - ({x.lo})];\n")


def with_clamp(ep: Epilogue) -> Epilogue:
    """An affine one-input op whose table is a clamp of the requantized value (`table_clamp`)."""
    return ep.then("_c", ("int32_t clo", "int32_t chi"), "", "r = r < clo ? clo : (r > chi ? chi : r);\n")


def fixed_epilogue(y: CType) -> Epilogue:
    """The runtime's saturating bias add (bias already at the output's position)."""
    return Epilogue("", (), f"const {y.name} bo = b != NULL ? b[oc] : 0;\n",
                    f"int32_t r = v;\nif (b != NULL) {{\n    r = qcc_sat_add(r, bo, {y.bits});\n}}\n", ("sat_add",))


def with_fixed_relu(ep: Epilogue, y: CType) -> Epilogue:
    """The dedicated fixed-point Relu: max(r, 0), then moved to the Relu's position."""
    return ep.then("_relu", ("int relu_shift",), "",
                   f"r = r > 0 ? r : 0;\nr = qcc_sat(qcc_shift(r, relu_shift), {y.lo}, {y.hi});\n", ("sat", "shift"))


# ---------------------------------------------------------------- shared pieces


def _indent(text: str, spaces: int) -> str:
    pad = " " * spaces
    return "".join(pad + line + "\n" if line else "\n" for line in text.splitlines())


def _short(ctype: str) -> str:
    return {"float": "f32", "int8_t": "i8", "int16_t": "i16", "uint8_t": "u8", "int32_t": "i32"}[ctype]


ROWS = (2, 4, 8)
"""The QCC_PB values the micro-kernels are written for (helpers picks one per instruction set):
divisors of WB."""
WB = 8
"""Output channels per block of the weights of the affine layers summed in float (`pack_conv_weights`)."""
FWB = 16
"""Output channels per block of the float convolution's weights (QCC_FWB): its micro-kernel keeps
up to 16 channels x 16 positions in registers (QCC_FPB rows; 16 with AVX-512)."""
FROWS = (2, 4, 8, 16)
"""The QCC_FPB values the float convolution's micro-kernel is written for: divisors of FWB."""
FB = 8
"""Output channels the fixed-point kernel computes at once (QCC_FB)."""


def _per_rows(body: Callable[[int], str], macro: str = "QCC_PB", rows: tuple[int, ...] = ROWS) -> str:
    """One function body per supported row count (`macro`), selected by the preprocessor."""
    parts = [f"#{'if' if i == 0 else 'elif'} {macro} == {pb}\n{body(pb)}" for i, pb in enumerate(rows)]
    return "".join(parts) + f"#else\n#error \"{macro} must be one of " + ", ".join(map(str, rows)) + "\"\n#endif\n"


def micro(ks: KernelSet, a: str, b: str, acc: str, wide: bool = False) -> str:
    """acc[q][j] += a[k][q] * b[k][j] for k < kc: QCC_PB rows of QCC_OB accumulators, the inner loop
    over the QCC_OB columns (one body per supported QCC_PB, chosen by the preprocessor). Row k of
    `a` starts at a + k * ka (its QCC_PB values are broadcast), row k of `b` at b + k * kb.
    Convolutions pass their weights (blocks of WB output channels) as `a` and the input (or a panel
    of it) as `b`. Float multiply-adds are fused when the target has a fast fmaf (QCC_MADD).
    `wide`: QCC_FPB rows (up to 16) instead of QCC_PB, for the float convolution's blocks of FWB, and
    a `first` flag that starts the sums at zero instead of reading them (no zeroing pass per tile)."""
    name = f"qcc_{'ftile' if wide else 'tile'}_{_short(a)}_{_short(b)}"
    madd = "QCC_MADD(x{q}, bk[j], a{q}[j])" if acc == "float" else "a{q}[j] + x{q} * bk[j]"
    if acc == "float":
        ks.helper("madd")

    def body(pb: int) -> str:
        rs = range(pb)
        decl = " ".join(f"{acc} a{q}[QCC_OB];" for q in rs)
        load = "\n".join(f"        a{q}[j] = acc[{q} * QCC_OB + j];" for q in rs)
        store = "\n".join(f"        acc[{q} * QCC_OB + j] = a{q}[j];" for q in rs)
        xs = "\n".join(f"        const {acc} x{q} = ak[{q}];" for q in rs)
        mac = "\n".join(f"            a{q}[j] = {madd.format(q=q)};" for q in rs)
        zero = "\n".join(f"        a{q}[j] = ({acc})0;" for q in rs)
        start = f"""    if (first) {{
        for (j = 0; j < QCC_OB; ++j) {{
{_indent(zero, 4)}        }}
    }} else {{
        for (j = 0; j < QCC_OB; ++j) {{
{_indent(load, 4)}        }}
    }}
""" if wide else f"""    for (j = 0; j < QCC_OB; ++j) {{
{load}
    }}
"""
        plain = f"""    {decl}
    long k;
    int j;
{start}    for (k = 0; k < kc; ++k) {{
        const {a} *restrict ak = a + k * ka;
        const {b} *restrict bk = b + k * kb;
{xs}
        for (j = 0; j < QCC_OB; ++j) {{
{mac}
        }}
    }}
    for (j = 0; j < QCC_OB; ++j) {{
{store}
    }}
"""
        if not (wide and pb == 16 and acc == "float" and a == "float" and b == "float"):
            return plain
        vdecl = ", ".join(f"a{q}" for q in rs)
        vzero = "\n".join(f"        a{q} = _mm512_setzero_ps();" for q in rs)
        vload = "\n".join(f"        a{q} = _mm512_loadu_ps(acc + {q} * QCC_OB);" for q in rs)
        vmac = "\n".join(f"        a{q} = QCC_VMADD(_mm512_set1_ps(ak[{q}]), bk, a{q});" for q in rs)
        vstore = "\n".join(f"    _mm512_storeu_ps(acc + {q} * QCC_OB, a{q});" for q in rs)
        return f"""#if QCC_VTILE
    __m512 {vdecl};
    long k;
    if (first) {{
{vzero}
    }} else {{
{vload}
    }}
    for (k = 0; k < kc; ++k) {{
        const float *restrict ak = a + k * ka;
        const __m512 bk = _mm512_loadu_ps(b + k * kb);
{vmac}
    }}
{vstore}
#else
{plain}#endif
"""
    if wide:
        ks.helper("vtile")
    return ks.kernel(name, lambda: f"""
/* acc[q][j] {"= (first ? 0 : acc[q][j]) +" if wide else "+="} a[k][q] * b[k][j]: the accumulators in registers, a fixed-length inner loop. */
QCC_DISPATCH {"QCC_NOINLINE " if wide else ""}static void {name}(const {a} *restrict a, long ka, const {b} *restrict b, long kb, long kc, {acc} *restrict acc{", int first" if wide else ""})
{{
{_per_rows(body, "QCC_FPB", FROWS) if wide else _per_rows(body)}}}
""", ("conv_t", "noinline") if wide else ("conv_t",))


# ---------------------------------------------------------------- float convolution


def pack_conv_weights(w: np.ndarray, group: int, wb: int = WB) -> np.ndarray:
    """OIHW float weights -> per group, blocks of `wb` output channels (zero-padded), each `[k][wb]`
    with k running over (ky, kx, input channel): the order of the panel's rows. The micro-kernel
    broadcasts QCC_PB (QCC_FPB) consecutive values of a row. Float layers take wb = FWB."""
    o, cg, kh, kw = w.shape
    og = o // group
    blocks = -(-og // wb)
    per = np.asarray(w).reshape(group, og, cg, kh, kw).transpose(0, 1, 3, 4, 2).reshape(group, og, -1)
    padded = np.zeros((group, blocks * wb, per.shape[2]), dtype=per.dtype)
    padded[:, :og] = per
    return padded.reshape(group, blocks, wb, -1).transpose(0, 1, 3, 2).reshape(-1)


def pack(ks: KernelSet, x: CType, panel: str | None = None) -> str:
    """The panel of one tile: taps (ky, kx, input channel) k0 .. k0 + kc - 1, QCC_OB positions each.

    The tile's positions are one or more row segments (the driver finds them). A tile inside one
    output row clips the input stretch it reads once per tap and copies it for every input
    channel (fixed-length when it is whole and the stride 1 or 2), padding the ends; a tile across
    rows (maps narrower than the tile) gathers per position with a mask, a fixed-length loop too.
    With a `panel` type the inputs are stored centered, `(panel)(x - zx)` (affine: padding 0 is
    then the real zero)."""
    centered = panel is not None
    elem = panel or x.name
    name = f"qcc_pack_{x.suffix}" + (f"_{_short(elem)}" if centered else "")

    def val(expr: str) -> str:
        return f"({elem})((int32_t){expr} - zx)" if centered else expr

    # float, stride 1 or 2, AVX-512: per segment one masked load (stride 2: two, then their even
    # elements; lanes outside the input read nothing and hold +0.0f, the float padding) instead of the
    # clipped copies, memcpy/memset calls and gathers.
    # Planes a multiple of 4 KB apart (a 32x32 map) put every channel's line of a tile into the same
    # L1 set, so tap by tap each line is evicted before the next tap reads it again: there one row
    # segment is filled channel by channel, each channel's taps at once (measured alone: 2.4x faster)
    masked = "" if centered else """#if QCC_MASKED_PACK
    if (p->sw == 1 && pad == 0.0f && nseg == 1 && hw % 1024 == 0) {
        const int ta = tap;
        const int tl = (int)((k0 + kc - 1) / cg) + 1;
        const int tn = tl - ta < QCC_PKT ? tl - ta : QCC_PKT;
        __mmask16 mk[QCC_PKT];
        long mo[QCC_PKT];
        int t, c;
        for (t = 0; t < tn; ++t) {
            const int iy = soy[0] * p->sh - p->ph + (ta + t) / p->kw * p->dh;
            const int ix = sox[0] - p->pw + (ta + t) % p->kw * p->dw;
            const int lo = ix >= 0 ? 0 : -ix;
            const int hi = p->w - ix < sq[1] ? p->w - ix : sq[1];
            mk[t] = (__mmask16)(iy < 0 || iy >= p->h || hi <= lo ? 0u : ((1u << hi) - 1u) & ~((1u << lo) - 1u));
            mo[t] = (long)iy * p->w + ix;
        }
        for (c = 0; c < cg; ++c) {
            const float *restrict xc = x + (long)c * hw;
            for (t = 0; t < tn; ++t) {
                const long kt = (long)(ta + t) * cg + c - k0;
                if (kt >= 0 && kt < kc) {
                    _mm512_storeu_ps(panel + kt * QCC_OB, _mm512_maskz_loadu_ps(mk[t], xc + mo[t]));
                }
            }
        }
        k = (long)(ta + tn) * cg - k0; /* taps past QCC_PKT: one by one below */
        tap = ta + tn;
        ic = 0;
    }
#endif
"""
    masked_taps = "" if centered else """#if QCC_MASKED_PACK
        if (p->sw == 1 && pad == 0.0f) {
            __mmask16 mk[QCC_OB];
            long mo[QCC_OB];
            for (s = 0; s < nseg; ++s) {
                const int iy = soy[s] * p->sh - p->ph + dy;
                const int ix = sox[s] - p->pw + dx; /* the input column of position sq[s] */
                const int lo = ix >= 0 ? sq[s] : sq[s] - ix;
                const int hi = p->w - ix < sq[s + 1] - sq[s] ? sq[s] + p->w - ix : sq[s + 1];
                mk[s] = (__mmask16)(iy < 0 || iy >= p->h || hi <= lo ? 0u : ((1u << hi) - 1u) & ~((1u << lo) - 1u));
                mo[s] = (long)iy * p->w + ix - sq[s];
            }
            for (j = 0; j < n; ++j) {
                const float *restrict xc = x + (long)(ic + j) * hw;
                __m512 v = _mm512_maskz_loadu_ps(mk[0], xc + mo[0]);
                for (s = 1; s < nseg; ++s) {
                    v = _mm512_mask_loadu_ps(v, mk[s], xc + mo[s]);
                }
                _mm512_storeu_ps(panel + (k + j) * QCC_OB, v);
            }
            k += n;
            ic = 0;
            ++tap;
            continue;
        }
        if (p->sw == 2 && pad == 0.0f) { /* 32 inputs (masked), their even elements */
            const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
            __mmask16 pm[QCC_OB], e0[QCC_OB], e1[QCC_OB];
            long mo[QCC_OB];
            for (s = 0; s < nseg; ++s) {
                const int iy = soy[s] * p->sh - p->ph + dy;
                const int ix = sox[s] * 2 - p->pw + dx; /* the input column of position sq[s] */
                const int lo = ix >= 0 ? sq[s] : sq[s] + (1 - ix) / 2;
                const int in = p->w - ix > 0 ? (p->w - ix + 1) / 2 : 0; /* positions from sq[s] inside */
                const int hi = in < sq[s + 1] - sq[s] ? sq[s] + in : sq[s + 1];
                /* elements 2 lo .. 2 hi - 2 relative to position 0 (all inside the row) */
                const unsigned em = iy < 0 || iy >= p->h || hi <= lo ? 0u
                    : (2 * hi - 1 >= 32 ? 0xffffffffu : (1u << (2 * hi - 1)) - 1u) & ~((1u << (2 * lo)) - 1u);
                pm[s] = (__mmask16)(em == 0u ? 0u : ((1u << hi) - 1u) & ~((1u << lo) - 1u));
                e0[s] = (__mmask16)(em & 0xffffu);
                e1[s] = (__mmask16)(em >> 16);
                mo[s] = (long)iy * p->w + ix - 2L * sq[s];
            }
            for (j = 0; j < n; ++j) {
                const float *restrict xc = x + (long)(ic + j) * hw;
                __m512 v = _mm512_setzero_ps();
                for (s = 0; s < nseg; ++s) {
                    const __m512 a = _mm512_maskz_loadu_ps(e0[s], xc + mo[s]);
                    const __m512 b = _mm512_maskz_loadu_ps(e1[s], xc + mo[s] + 16);
                    v = _mm512_mask_mov_ps(v, pm[s], _mm512_permutex2var_ps(a, even, b));
                }
                _mm512_storeu_ps(panel + (k + j) * QCC_OB, v);
            }
            k += n;
            ic = 0;
            ++tap;
            continue;
        }
#endif
"""

    return ks.kernel(name, lambda: f"""
/* panel[k][q] = x at tap (ky, kx), input channel ic of output position q, for k0 <= k < k0 + kc
   with k = (ky * kw + kx) * cg + ic; positions outside the input (or past the map) read `pad`.
   Segment s: positions sq[s] .. sq[s + 1] - 1 of output row soy[s] from column sox[s]. */
QCC_DISPATCH static void {name}(const {x.name} *restrict x, {elem} *restrict panel, const qcc_conv_t *restrict p,
    int nseg, const int *restrict sq, const int *restrict soy, const int *restrict sox, long k0, long kc,
    {elem} pad{", int32_t zx" if centered else ""})
{{
    const int cg = p->c / p->group;
    const long hw = (long)p->h * p->w;
    int tap = (int)(k0 / cg);
    int ic = (int)(k0 % cg);
    long k = 0;
{masked}    while (k < kc) {{
        const int dy = tap / p->kw * p->dh;
        const int dx = tap % p->kw * p->dw;
        const int n = (int)(cg - ic < kc - k ? cg - ic : kc - k);
        long off[QCC_OB];
        int ok[QCC_OB];
        int s, q, j, t0 = 0, t1 = 0;
        long base = 0;
{masked_taps}        if (nseg == 1) {{
            const int len = sq[1];
            const int iy = soy[0] * p->sh - p->ph + dy;
            const int ix = sox[0] * p->sw - p->pw + dx;
            t0 = ix >= 0 ? 0 : (-ix + p->sw - 1) / p->sw;
            t1 = ix >= p->w ? 0 : (p->w - ix + p->sw - 1) / p->sw;
            t0 = t0 < len ? t0 : len;
            t1 = t1 < len ? t1 : len;
            if (iy < 0 || iy >= p->h || t1 < t0) {{
                t0 = t1 = 0;
            }}
            base = (long)iy * p->w + ix + (long)t0 * p->sw;
        }} else {{
            for (q = 0; q < QCC_OB; ++q) {{
                ok[q] = 0;
                off[q] = 0;
            }}
            for (s = 0; s < nseg; ++s) {{
                const int iy = soy[s] * p->sh - p->ph + dy;
                for (q = sq[s]; q < sq[s + 1]; ++q) {{
                    const int ix = (sox[s] + q - sq[s]) * p->sw - p->pw + dx;
                    ok[q] = iy >= 0 && iy < p->h && ix >= 0 && ix < p->w;
                    off[q] = ok[q] ? (long)iy * p->w + ix : 0;
                }}
            }}
        }}
        for (j = 0; j < n; ++j) {{
            const {x.name} *restrict xc = x + (long)(ic + j) * hw;
            {elem} *restrict pk = panel + (k + j) * QCC_OB;
            if (nseg > 1) {{
                QCC_VECTOR_LOOP
                for (q = 0; q < QCC_OB; ++q) {{
                    const {elem} v = {val("xc[off[q]]")};
                    pk[q] = ok[q] ? v : pad;
                }}
            }} else if (t0 == 0 && t1 == QCC_OB && p->sw == 1) {{
                const {x.name} *restrict xr = xc + base;
                QCC_VECTOR_LOOP
                for (q = 0; q < QCC_OB; ++q) {{
                    pk[q] = {val("xr[q]")};
                }}
            }} else if (t0 == 0 && t1 == QCC_OB && p->sw == 2) {{
                const {x.name} *restrict xr = xc + base;
                QCC_VECTOR_LOOP
                for (q = 0; q < QCC_OB; ++q) {{
                    pk[q] = {val("xr[2 * q]")};
                }}
            }} else if (p->sw == 1) {{ /* a row's edge: padding, then the part inside, contiguous */
                const long at = base - t0;
                QCC_VECTOR_LOOP
                for (q = 0; q < QCC_OB; ++q) {{
                    pk[q] = pad;
                }}
                for (q = t0; q < t1; ++q) {{
                    pk[q] = {val("xc[at + q]")};
                }}
            }} else {{
                for (q = 0; q < t0; ++q) {{
                    pk[q] = pad;
                }}
                for (q = t0; q < t1; ++q) {{
                    pk[q] = {val("xc[base + (long)(q - t0) * p->sw]")};
                }}
                for (q = t1 > t0 ? t1 : t0; q < QCC_OB; ++q) {{
                    pk[q] = pad;
                }}
            }}
        }}
        k += n;
        ic = 0;
        ++tap;
    }}
}}
""", ("conv_t", "masked_pack") if not centered else ("conv_t",))


def conv_affine_exact_float(ks: KernelSet, x: CType, y: CType, ep: Epilogue) -> str:
    """The tiled kernel for affine layers with few taps, summing in float32: centered inputs and
    weights (`pack_conv_weights`, stored float) are small integers, and while every partial sum stays
    below 2^24 in magnitude (`float_sums_exact`) each product and each sum is exact, fused or not, in
    any order: the int32 sum, bit for bit, at the float kernel's speed (two FMA ports with 16 lanes
    where int32 multiplies have one, and SSE2 has none)."""
    return _conv_tiled(ks, x, FLOAT, y, ep, f"qcc_convf_{x.suffix}_{y.suffix}{ep.suffix}")


def float_sums_exact(weights: np.ndarray, x: CType) -> bool:
    """Every partial sum of (x - zx) * w over a channel's taps below 2^24: exact in float32."""
    assert x.affine is not None
    zx = int(x.affine.zero_point[0])
    w = np.abs(np.asarray(weights, dtype=np.int64).reshape(weights.shape[0], -1))
    return bool(w.size) and int(w.sum(axis=1).max()) * max(zx - x.lo, x.hi - zx) < 2**24


def conv_float(ks: KernelSet, ep: Epilogue) -> str:
    """Tiles of QCC_OB output positions (flattened over the map) by QCC_PB output channels: the
    micro-kernel broadcasts weights (`pack_conv_weights`) over a panel of the tile's taps, QCC_KC
    at a time, and the epilogue runs along the positions. The panel is contiguous even for a 1x1
    convolution: every output channel block reads it, and input rows a power of two apart (a
    32x32 float map is 4 KB) would all fall into the same cache sets."""
    return _conv_tiled(ks, FLOAT, FLOAT, FLOAT, ep, f"qcc_conv_f32{ep.suffix}")


def _conv_tiled(ks: KernelSet, x: CType, w: CType, y: CType, ep: Epilogue, name: str) -> str:
    """The tiled kernel: float, or affine integers summed exactly in float (`conv_affine_exact_float`)
    on a panel of centered inputs (padding 0, the real zero); no horizontal sum (layers with few taps
    per output, where the dot products' sums dominate). Float layers take weight blocks of FWB output
    channels and the QCC_FPB-row micro-kernel (16 x 16 sums with AVX-512: 16 independent FMA chains
    per panel load instead of 8), the QCC_PB-row one for a block's last rows when at most half remain."""
    affine = x.affine is not None
    acc = "float"
    elem = acc if affine else x.name
    packer = pack(ks, x, elem if affine else None)
    tile = micro(ks, w.name, elem, acc)
    v_t = "int32_t" if affine else "float"
    if affine:
        extra = (", int32_t zx, const int32_t *restrict bias, const int32_t *restrict mult, "
                 "const int32_t *restrict shift")
        bias, pad, zero = "", "0, zx", "0"
    else:
        extra, bias, pad, zero = "", ", const float *restrict b", "0.0f", "0.0f"
    wide = not affine
    wb, os_ = ("QCC_FWB", "osz") if wide else ("QCC_WB", "QCC_OS")
    if wide:
        ftile = micro(ks, w.name, elem, acc, wide=True)
        tiles = f"""for (o = 0; o < nb;) {{
        if (nb - o > QCC_FPB / 2) {{
            {ftile}(WROW(k0), {wb}, src, kb, kc, part + o * QCC_OB, k0 == 0);
            o += QCC_FPB;
        }} else {{
            {tile}(WROW(k0), {wb}, src, kb, kc, part + o * QCC_OB);
            o += QCC_PB;
        }}
    }}"""
        # only rows the QCC_PB-row kernel sums (a block's last rows, at most half of it) start at zero here
        zeroing = f"""if (nb % QCC_FPB != 0 && nb % QCC_FPB <= QCC_FPB / 2) {{
    for (j = (nb - nb % QCC_FPB) * QCC_OB; j < (nb - nb % QCC_FPB + QCC_FPB) * QCC_OB; ++j) {{
        part[j] = {zero};
    }}
}}"""
        # taps in chunks of equal size (288 = 3 x 96, not 128 + 128 + 32: the same sums, fewer short
        # calls); a whole tile of a 1x1 layer over a flattened map (h = 1, stride 1, no padding) reads
        # its input rows in place: no panel copy (QCC_FDIRECT: with 16-row tiles; with 4 rows every
        # input line is read by four calls, and the panel was faster: portable resnet23 1.22x slower)
        chunks = f"""for (k0 = 0; k0 < kk; k0 += kcs) {{
    const long kc = kk - k0 < kcs ? kk - k0 : kcs;
    const int direct = flat && pn == QCC_OB;
    const {elem} *restrict src = direct ? xg + k0 * hw + p0 : panel;
    const long kb = direct ? hw : QCC_OB;
    if (!direct) {{
        {packer}(xg, panel, p, nseg, sq, soy, sox, k0, kc, {pad});
    }}
    {tiles}
}}"""
        # output planes a multiple of 4 KB apart put a tile's output lines (one per channel) into one
        # L1 set: short sums (a first layer, 1x1 on 32 channels) store 16 channels per pass over the
        # map, repacking their few taps per pass (resnet23 native 0.93x; the same sums; with 4-row
        # tiles, portable, 1.03x slower: 16-row tiles only)
        setup = """    const int osz = QCC_FPB >= 16 && kk <= 32 && npix % 1024 == 0 ? QCC_FWB : QCC_FOS;
    const long kcs = (kk + (kk + QCC_KC - 1) / QCC_KC - 1) / ((kk + QCC_KC - 1) / QCC_KC);
    const long hw = (long)p->h * p->w;
    const int flat = QCC_FDIRECT && p->kh == 1 && p->kw == 1 && p->h == 1 && p->oh == 1 && p->sw == 1 && p->pw == 0;
"""
    else:
        setup = ""
        tiles = f"""for (o = 0; o < nb; o += QCC_PB) {{
        {tile}(WROW(k0), {wb}, panel, QCC_OB, kc, part + o * QCC_OB);
    }}"""
        chunks = f"""for (k0 = 0; k0 < kk; k0 += QCC_KC) {{
    const long kc = kk - k0 < QCC_KC ? kk - k0 : QCC_KC;
    {packer}(xg, panel, p, nseg, sq, soy, sox, k0, kc, {pad});
    {tiles}
}}"""
        zeroing = f"""for (j = 0; j < nb * QCC_OB; ++j) {{
    part[j] = {zero};
}}"""
    for helper in ep.helpers:
        ks.helper(helper)
    # float: the output line two tiles ahead is about to be written (QCC_PREFETCHW); same values
    ahead = ("                        if (p0 + 2 * QCC_OB < npix) {\n"
             "                            QCC_PREFETCHW(yo + 2 * QCC_OB);\n"
             "                        }\n") if wide else ""
    if wide:
        ks.helper("prefetchw")
    params = "".join(f", {p}" for p in ep.params)
    return ks.kernel(name, lambda: f"""
QCC_DISPATCH static void {name}(const {x.name} *restrict x, const {w.name} *restrict w{bias}, {y.name} *restrict y,
    const qcc_conv_t *restrict p{extra}{params})
{{
    const int cg = p->c / p->group;
    const int og = p->o / p->group;
    const long npix = (long)p->oh * p->ow;
    const long kk = (long)cg * p->kh * p->kw;
    const int blocks = (og + {wb} - 1) / {wb};
{setup}    {elem} panel[QCC_KC * QCC_OB];
    {acc} part[{"QCC_FOS" if wide else "QCC_OS"} * QCC_OB];
    int sq[QCC_OB + 1], soy[QCC_OB], sox[QCC_OB];
    int n, g, ob0, q, o, j, nseg;
    long p0, k0;
    /* weights of output channels ob0 + o .. (a multiple of the rows inside their block of {wb}), tap k */
#define WROW(k) (wg + ((long)(ob0 + o) / {wb} * kk + (k)) * {wb} + (ob0 + o) % {wb})
    for (n = 0; n < p->n; ++n) {{
        for (g = 0; g < p->group; ++g) {{
            const {x.name} *restrict xg = x + ((long)n * p->c + (long)g * cg) * p->h * p->w;
            const {w.name} *restrict wg = w + (long)g * blocks * {wb} * kk;
            for (ob0 = 0; ob0 < og; ob0 += {os_}) {{
                const int nb = og - ob0 < {os_} ? og - ob0 : {os_};
                for (p0 = 0; p0 < npix; p0 += QCC_OB) {{
                    const int pn = npix - p0 < QCC_OB ? (int)(npix - p0) : QCC_OB;
{_indent(zeroing, 20)}
                    /* the tile's row segments (positions past pn belong to none: padding) */
                    nseg = 0;
                    for (q = 0; q < pn; ++nseg) {{
                        const long pq = p0 + q;
                        soy[nseg] = (int)(pq / p->ow);
                        sox[nseg] = (int)(pq % p->ow);
                        sq[nseg] = q;
                        q += p->ow - sox[nseg] < pn - q ? p->ow - sox[nseg] : pn - q;
                    }}
                    sq[nseg] = pn;
{_indent(chunks, 20)}
                    for (o = 0; o < nb; ++o) {{
                        const int oc = g * og + ob0 + o;
                        {y.name} *restrict yo = y + ((long)n * p->o + oc) * npix + p0;
                        {v_t} out[QCC_OB];
{ahead}{_indent(ep.channel, 24)}                        QCC_VECTOR_LOOP
                        for (j = 0; j < QCC_OB; ++j) {{
                            const {v_t} v = ({v_t})part[o * QCC_OB + j];
{_indent(ep.element, 28)}                            out[j] = r;
                        }}
                        if (pn == QCC_OB) {{ /* a whole tile: a fixed-length store, not a call to memcpy */
                            QCC_VECTOR_LOOP
                            for (j = 0; j < QCC_OB; ++j) {{
                                {v_t} r = out[j];
{_indent(ep.post, 32)}                                yo[j] = ({y.name})r;
                            }}
                        }} else {{
                            for (j = 0; j < pn; ++j) {{
                                {v_t} r = out[j];
{_indent(ep.post, 32)}                                yo[j] = ({y.name})r;
                            }}
                        }}
                    }}
                }}
            }}
        }}
    }}
#undef WROW
}}
""", ("conv_t",))


# ---------------------------------------------------------------- affine convolution: dot products


DOT_MR = 4
"""Output channels per affine micro-kernel call (the weights' rows are padded to a multiple)."""
DOT_NR = 4
"""Output positions per affine tile."""
DOT_KA = 16
"""The affine panel's rows and the weights' rows are padded to a multiple of this many taps."""


def pack_affine_weights(w: np.ndarray, group: int, columns: bool = False) -> np.ndarray:
    """Centered OIHW (or Dense's transposed (M, K) as (M, K, 1, 1)) weights -> per group, rows of
    DOT_MR-padded output channels, each tap-major (ky, kx, input channel; with `columns`, the order
    of the uint8 kernels' column band: kx, ky, input channel) and zero-padded to a multiple of DOT_KA
    taps: the dot products' contiguous operand."""
    o, cg, kh, kw = w.shape
    og = o // group
    rows = -(-og // DOT_MR) * DOT_MR
    taps = kh * kw * cg
    kp = -(-taps // DOT_KA) * DOT_KA
    order = (0, 1, 4, 3, 2) if columns else (0, 1, 3, 4, 2)
    per = w.reshape(group, og, cg, kh, kw).transpose(*order).reshape(group, og, taps)
    out = np.zeros((group, rows, kp), dtype=w.dtype)
    out[:, :og, :taps] = per
    return out.reshape(-1)


def dot_micro(ks: KernelSet, w: CType, panel: str = "int16_t") -> str:
    """out[o][q] += sum over k of w[o][k] * panel[q][k]: DOT_MR x DOT_NR sums, the reduction over k
    innermost: what compilers turn into pmaddwd / vpdpwssd on int16 panels, vpdpbusd (four uint8 x int8
    products a 32-bit lane) on uint8 panels with int8 weights, SMLAD on Cortex-M."""
    name = f"qcc_dot_{_short(panel)}_{w.suffix}"
    rows, cols = range(DOT_MR), range(DOT_NR)

    weights = "\n".join(f"    const {w.name} *restrict w{o} = w + {o} * ldw;" for o in rows)
    decl = "\n".join(f"    int32_t {', '.join(f's{o}{q} = 0' for q in cols)};" for o in rows)
    loads = "\n".join(f"        const int32_t a{q} = x{q}[k];" for q in cols) + "\n" + \
        "\n".join(f"        const int32_t b{o} = w{o}[k];" for o in rows)
    macs = "\n".join(f"        {' '.join(f's{o}{q} += b{o} * a{q};' for q in cols)}" for o in rows)
    store = "\n".join(f"    out[{o} * QCC_PT + {q}] += s{o}{q};" for o in rows for q in cols)
    rows_in = ", ".join(f"const {panel} *restrict x{q}" for q in cols)
    return ks.kernel(name, lambda: f"""
/* out[o * QCC_PT + q] += dot(w row o, row xq) over kc taps. GCC on x86-64 compiles it for 256-bit
   vectors even where 512-bit ones are allowed (-march with AVX-512): the sums are short and the
   wider vectors' horizontal sums and remainders cost more than they save (measured on digits 1.9x,
   squeezenet 1.3x the time; bench/bench_c.py); its portable build's versions stop at AVX2 for the
   same reason. A tuning hint; other compilers ignore it. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__AVX512F__)
#pragma GCC push_options
#pragma GCC target("prefer-vector-width=256")
#endif
QCC_DISPATCH256 static void {name}({rows_in}, const {w.name} *restrict w, long ldw, long kc, int32_t *restrict out)
{{
{weights}
{decl}
    long k;
    for (k = 0; k < kc; ++k) {{
{loads}
{macs}
    }}
{store}
}}
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__AVX512F__)
#pragma GCC pop_options
#endif
""")


def _panel_offset(x: CType, elem: str) -> str:
    """What a panel adds to the centered input x - zx: nothing on int16 panels; zx - lo on uint8 panels,
    which hold x - lo (0 .. 255; the padding zx - lo), the kernel's bias having subtracted
    (zx - lo) times the weights' sum (`offset_bias`)."""
    return f" + (zx - ({x.lo}))" if elem == "uint8_t" else ""


def _pack_rows(ks: KernelSet, x: CType, elem: str) -> str:
    name = f"qcc_packr_{x.suffix}_{_short(elem)}"
    zu = _panel_offset(x, elem)
    # uint8 rows follow the column band's tap order (kx, ky, input channel), int16 rows (ky, kx, ...)
    dy, dx = ("tap % p->kh", "tap / p->kh") if elem == "uint8_t" else ("tap / p->kw", "tap % p->kw")
    taps = f"        const int dy = {dy} * p->dh;\n        const int dx = {dx} * p->dw;"

    return ks.kernel(name, lambda: f"""
/* panel[q][k] = x - zx (uint8 rows: x - lo) at tap k (k0 <= k < k0 + kc; (ky, kx, input channel)
   order, uint8 rows (kx, ky, input channel)) of output position q < QCC_PT; 0 (uint8: zx - lo) outside
   the input (read at offset 0 and masked: no branch in the loop) and for kc <= k < kcp. */
static void {name}(const {x.name} *restrict x, {elem} *restrict panel, const qcc_conv_t *restrict p,
    const int *restrict iy0, const int *restrict ix0, long k0, long kc, long kcp, int32_t zx)
{{
    const int cg = p->c / p->group;
    const long hw = (long)p->h * p->w;
    int tap = (int)(k0 / cg);
    int ic = (int)(k0 % cg);
    long k = 0, j;
    int q;
    while (k < kc) {{
{taps}
        const long n = cg - ic < kc - k ? cg - ic : kc - k;
        long off[QCC_PT];
        int32_t mask[QCC_PT];
        for (q = 0; q < QCC_PT; ++q) {{
            const int iy = iy0[q] + dy;
            const int ix = ix0[q] + dx;
            const int inside = iy >= 0 && iy < p->h && ix >= 0 && ix < p->w;
            off[q] = inside ? (long)iy * p->w + ix : 0;
            mask[q] = inside ? -1 : 0;
        }}
        for (j = 0; j < n; ++j) {{
            const {x.name} *restrict xc = x + (ic + j) * hw;
            for (q = 0; q < QCC_PT; ++q) {{
                panel[q * kcp + k + j] = ({elem})((((int32_t)xc[off[q]] - zx) & mask[q]){zu});
            }}
        }}
        k += n;
        ic = 0;
        ++tap;
    }}
    for (q = 0; q < QCC_PT; ++q) {{
        for (j = kc; j < kcp; ++j) {{
            panel[q * kcp + j] = 0;
        }}
    }}
}}
""", ("conv_t",))


def _band_rows(ks: KernelSet, x: CType) -> str:
    name = f"qcc_band_{x.suffix}"
    return ks.kernel(name, lambda: f"""
/* The input rows output row oy reads, each transposed to [column][input channel] (x - zx; 0 in the
   padding) in band slot ((iy mod kh) with dilation 1, so rows shared with the previous output row
   are kept; else ky). held[slot] is the row a slot holds. */
static void {name}(const {x.name} *restrict x, int16_t *restrict band, int *restrict held,
    const qcc_conv_t *restrict p, int oy, long wb, int32_t zx)
{{
    const int cg = p->c / p->group;
    const long hw = (long)p->h * p->w;
    const int lo = p->pw < wb ? p->pw : (int)wb;
    const int hi = p->pw + p->w < wb ? p->pw + p->w : (int)wb;
    int ky, ic;
    long b;
    for (ky = 0; ky < p->kh; ++ky) {{
        const int iy = oy * p->sh - p->ph + ky * p->dh;
        const int slot = p->dh == 1 ? ((iy % p->kh) + p->kh) % p->kh : ky;
        int16_t *restrict row = band + slot * wb * cg;
        if (held[slot] == iy) {{
            continue;
        }}
        held[slot] = iy;
        if (iy < 0 || iy >= p->h) {{
            for (b = 0; b < wb * cg; ++b) {{
                row[b] = 0;
            }}
            continue;
        }}
        for (b = 0; b < (long)lo * cg; ++b) {{
            row[b] = 0;
        }}
        for (b = (long)hi * cg; b < wb * cg; ++b) {{
            row[b] = 0;
        }}
        for (ic = 0; ic < cg; ++ic) {{
            const {x.name} *restrict xr = x + ic * hw + (long)iy * p->w - p->pw;
            for (b = lo; b < hi; ++b) {{
                row[b * cg + ic] = (int16_t)((int32_t)xr[b] - zx);
            }}
        }}
    }}
}}

/* panel[q][k] for output positions ox0 + q (q < pn; 0 for pn <= q < QCC_PT) of row oy from the band:
   runs of input channels, whole kernel rows at once with dilation 1; 0 for kc <= k < kcp. */
static void qcc_band_panel(const int16_t *restrict band, int16_t *restrict panel, const qcc_conv_t *restrict p,
    int oy, int ox0, int pn, long wb, long k0, long kc, long kcp)
{{
    const int cg = p->c / p->group;
    int q;
    long j;
    for (q = 0; q < QCC_PT; ++q) {{
        int16_t *restrict out = panel + q * kcp;
        int tap = (int)(k0 / cg);
        int ic = (int)(k0 % cg);
        long k = 0;
        if (q >= pn) {{
            for (j = 0; j < kcp; ++j) {{
                out[j] = 0;
            }}
            continue;
        }}
        while (k < kc) {{
            const int ky = tap / p->kw;
            const int kx = tap % p->kw;
            const int iy = oy * p->sh - p->ph + ky * p->dh;
            const int slot = p->dh == 1 ? ((iy % p->kh) + p->kh) % p->kh : ky;
            const int16_t *restrict src = band + (slot * wb + (long)(ox0 + q) * p->sw + (long)kx * p->dw) * cg + ic;
            const long run = (p->dw == 1 ? (long)(p->kw - kx) * cg : cg) - ic;
            const long n = run < kc - k ? run : kc - k;
            for (j = 0; j < n; ++j) {{
                out[k + j] = src[j];
            }}
            k += n;
            tap += (int)((ic + n) / cg);
            ic = (int)((ic + n) % cg);
        }}
        for (j = kc; j < kcp; ++j) {{
            out[j] = 0;
        }}
    }}
}}
""", ("conv_t",))


def _column_band(ks: KernelSet, x: CType) -> str:
    name = f"qcc_cband_{x.suffix}"
    return ks.kernel(name, lambda: f"""
/* The input output row oy reads from input column ix0 on, as wb columns: band[(b * kh + ky) * cg + ic]
   = x - lo at input row oy * sh - ph + ky * dh, column ix0 + b (zx - lo, the offset zero, outside the
   input), so the taps of an output position, (kx, ky, input channel), are kw * kh * cg consecutive
   bytes, those of the next position sw columns further. */
static void {name}(const {x.name} *restrict x, uint8_t *restrict band, const qcc_conv_t *restrict p, int oy,
    long ix0, long wb, int32_t zx)
{{
    const int cg = p->c / p->group;
    const long hw = (long)p->h * p->w;
    const long col = (long)p->kh * cg;
    const uint8_t zu = (uint8_t)(zx - ({x.lo}));
    const long lo = ix0 >= 0 ? 0 : (-ix0 < wb ? -ix0 : wb);
    const long hi = p->w - ix0 < wb ? (p->w - ix0 > lo ? p->w - ix0 : lo) : wb;
    int ky, ic;
    long b;
    for (ky = 0; ky < p->kh; ++ky) {{
        const int iy = oy * p->sh - p->ph + ky * p->dh;
        uint8_t *restrict slot = band + (long)ky * cg;
        const int inside = iy >= 0 && iy < p->h;
        for (b = 0; b < wb; ++b) {{
            if (!inside || b < lo || b >= hi) {{
                for (ic = 0; ic < cg; ++ic) {{
                    slot[b * col + ic] = zu;
                }}
            }}
        }}
        if (!inside) {{
            continue;
        }}
        for (ic = 0; ic < cg; ++ic) {{
            const {x.name} *restrict xr = x + ic * hw + (long)iy * p->w + ix0;
            for (b = lo; b < hi; ++b) {{
                slot[b * col + ic] = (uint8_t)((int32_t)xr[b] - ({x.lo}));
            }}
        }}
    }}
}}
""", ("conv_t",))


def conv_affine(ks: KernelSet, x: CType, w: CType, y: CType, ep: Epilogue, elem: str = "int16_t") -> str:
    """Sums of (x - zx) * w as dot products: per tile of QCC_PT output positions, every QCC_MR output
    channels take their dot products with QCC_NR rows of taps at a time; the bias and requantization
    in the epilogue, a fixed-length loop per output channel. Weights: `pack_affine_weights`.

    `elem` "int16_t": the rows hold x - zx, copied from the input QCC_KCI taps at a time; kernels wider
    than one tap whose input rows fit QCC_BAND elements copy each input row once, transposed (a band
    of kh rows, reused by the next output row), and fill the rows from it with runs of input channels.
    `elem` "uint8_t" (int8 weights, `pack_affine_weights(columns=True)`): the rows hold x - lo
    (`_panel_offset`; the bias passed is `offset_bias`'s) and the dot products are uint8 x int8
    (vpdpbusd with AVX512-VNNI / AVX-VNNI). With dilation 1 along x and a column band
    (`_column_band`) of QCC_BAND bytes at most, the dot products read the band in place: one copy of
    kh input rows per output row, no panel. The rest gather the taps from the input."""
    u8 = elem == "uint8_t"
    name = f"qcc_conv_{x.suffix}_{w.suffix}_{y.suffix}{'_u8' if u8 else ''}{ep.suffix}"
    packer = _pack_rows(ks, x, elem)
    bander = _column_band(ks, x) if u8 else _band_rows(ks, x)
    dot = dot_micro(ks, w, elem)
    for helper in ep.helpers:
        ks.helper(helper)
    params = "".join(f", {p}" for p in ep.params)
    epilogue = f"""    for (o = 0; o < nb; ++o) {{
        const int oc = g * og + ob0 + o;
        {y.name} *restrict yo = y + ((long)n * p->o + oc) * npix + P0;
        int32_t out[QCC_PT];
{_indent(ep.channel, 8)}        QCC_VECTOR_LOOP
        for (q = 0; q < QCC_PT; ++q) {{
            const int32_t v = part[o * QCC_PT + q];
{_indent(ep.element, 12)}            out[q] = r;
        }}
        for (q = 0; q < pn; ++q) {{
            int32_t r = out[q];
{_indent(ep.post, 12)}            yo[q] = ({y.name})r;
        }}
    }}
"""
    rows_at = ", ".join(f"panel + ((long)q * QCC_NR + {r}) * kcp" for r in range(DOT_NR))
    tile = f"""{{
    const int pairs = (pn + QCC_NR - 1) / QCC_NR;
    for (j = 0; j < QCC_OS * QCC_PT; ++j) {{
        part[j] = 0;
    }}
    for (k0 = 0; k0 < kk; k0 += QCC_KCI) {{
        const long kc = kk - k0 < QCC_KCI ? kk - k0 : QCC_KCI;
        const long kcp = (kc + QCC_KA - 1) / QCC_KA * QCC_KA;
        PACK;
        for (o = 0; o < nb; o += QCC_MR) {{
            const {w.name} *restrict wo = w + ((long)g * rows + ob0 + o) * kp + k0;
            for (q = 0; q < pairs; ++q) {{
                {dot}({rows_at}, wo, kp, kcp, part + (long)o * QCC_PT + q * QCC_NR);
            }}
        }}
    }}
{epilogue}}}
"""
    gather = tile.replace("PACK", f"{packer}(x + xoff, panel, p, iy0, ix0, k0, kc, kcp, zx)").replace("P0", "p0")
    if u8:
        # rows past the map's end repeat its last position (their sums are not stored)
        cols_at = ", ".join(f"band + (ox0 - c0 + (q + {r} < pn ? q + {r} : pn - 1)) * step" for r in range(DOT_NR))
        banded = f"""{{
    for (j = 0; j < QCC_OS * QCC_PT; ++j) {{
        part[j] = 0;
    }}
    for (o = 0; o < nb; o += QCC_MR) {{
        const {w.name} *restrict wo = w + ((long)g * rows + ob0 + o) * kp;
        for (q = 0; q < pn; q += QCC_NR) {{
            {dot}({cols_at}, wo, kp, kk, part + (long)o * QCC_PT + q);
        }}
    }}
{epilogue.replace("P0", "(long)oy * p->ow + ox0")}}}
"""
        # output rows in chunks of cw positions whose band fits QCC_BAND bytes (a multiple of QCC_PT)
        band_setup = """    const long step = (long)p->sw * p->kh * cg;
    const long fit = QCC_BAND / ((long)p->kh * cg) < p->kw ? 0 : (QCC_BAND / ((long)p->kh * cg) - p->kw) / p->sw + 1;
    const long cw = fit >= p->ow ? p->ow : fit / QCC_PT * QCC_PT;
    const int use_band = p->dw == 1 && cw > 0;
    long c0;
    uint8_t band[QCC_BAND > 0 ? QCC_BAND : 1];"""
        band_start = ""
        band_call = ""
    else:
        banded = tile.replace("PACK", "qcc_band_panel(band, panel, p, oy, ox0, pn, wb, k0, kc, kcp)") \
            .replace("P0", "(long)oy * p->ow + ox0")
        band_setup = f"""    const long wb = (long)(p->ow - 1) * p->sw + (long)(p->kw - 1) * p->dw + 1;
    const int use_band = p->kh * p->kw > 1 && p->kh <= QCC_RING && (long)p->kh * wb * cg <= QCC_BAND;
    {elem} band[QCC_BAND > 0 ? QCC_BAND : 1];
    int held[QCC_RING];"""
        band_start = """                for (q = 0; q < QCC_RING; ++q) {
                    held[q] = -(1 << 30);
                }
"""
        band_call = f"{bander}(x + xoff, band, held, p, oy, wb, zx);"
    positions = f"""for (ob0 = 0; ob0 < og; ob0 += QCC_OS) {{
    const int nb = og - ob0 < QCC_OS ? og - ob0 : QCC_OS;
    for (ox0 = C0; ox0 < C1; ox0 += QCC_PT) {{
        const int pn = C1 - ox0 < QCC_PT ? (int)(C1 - ox0) : QCC_PT;
{_indent(banded, 8)}    }}
}}
"""
    if u8:
        band_loop = f"""for (c0 = 0; c0 < p->ow; c0 += cw) {{
    const long c1 = p->ow - c0 < cw ? p->ow : c0 + cw;
    {bander}(x + xoff, band, p, oy, c0 * p->sw - p->pw, (c1 - c0 - 1) * p->sw + p->kw, zx);
{_indent(positions.replace("C0", "c0").replace("C1", "c1"), 4)}}}
"""
    else:
        band_loop = f"{band_call}\n" + positions.replace("C0", "0").replace("C1", "p->ow")
    return ks.kernel(name, lambda: f"""
static void {name}(const {x.name} *restrict x, const {w.name} *restrict w, {y.name} *restrict y,
    const qcc_conv_t *restrict p, int32_t zx, const int32_t *restrict bias, const int32_t *restrict mult,
    const int32_t *restrict shift{params})
{{
    const int cg = p->c / p->group;
    const int og = p->o / p->group;
    const int rows = (og + QCC_MR - 1) / QCC_MR * QCC_MR;
    const long npix = (long)p->oh * p->ow;
    const long kk = (long)cg * p->kh * p->kw;
    const long kp = (kk + QCC_KA - 1) / QCC_KA * QCC_KA;
{band_setup}
    {elem} panel[QCC_PT * QCC_KCI];
    int32_t part[QCC_OS * QCC_PT];
    int iy0[QCC_PT], ix0[QCC_PT];
    int n, g, ob0, q, o, oy, ox0;
    long p0, k0, j;
    for (n = 0; n < p->n; ++n) {{
        for (g = 0; g < p->group; ++g) {{
            const long xoff = ((long)n * p->c + (long)g * cg) * p->h * p->w;
            if (use_band) {{
{band_start}                for (oy = 0; oy < p->oh; ++oy) {{
{_indent(band_loop, 20)}                }}
                continue;
            }}
            for (ob0 = 0; ob0 < og; ob0 += QCC_OS) {{
                const int nb = og - ob0 < QCC_OS ? og - ob0 : QCC_OS;
                for (p0 = 0; p0 < npix; p0 += QCC_PT) {{
                    const int pn = npix - p0 < QCC_PT ? (int)(npix - p0) : QCC_PT;
                    for (q = 0; q < QCC_PT; ++q) {{
                        const long pq = p0 + q;
                        iy0[q] = q < pn ? (int)(pq / p->ow) * p->sh - p->ph : -(1 << 29);
                        ix0[q] = q < pn ? (int)(pq % p->ow) * p->sw - p->pw : -(1 << 29);
                    }}
{_indent(gather, 20)}                }}
            }}
        }}
    }}
}}
""", ("conv_t",))


def offset_bias(weights: np.ndarray, bias: np.ndarray, zx: int, lo: int) -> np.ndarray:
    """The accumulator bias of a uint8-panel kernel (`conv_affine` with elem uint8_t): the panel holds
    x - lo where the sum wants x - zx, so every output channel's sum is (zx - lo) * (sum of its
    weights) too large; exact, folded into the bias once."""
    sums = np.asarray(weights, dtype=np.int64).reshape(weights.shape[0], -1).sum(axis=1)
    return np.asarray(bias, dtype=np.int64) - (zx - lo) * sums


def u8_dot_fits(weights: np.ndarray, lo: int, hi: int) -> bool:
    """int8 weights whose uint8 x int8 dot products cannot overflow int32 (any input, padding included)."""
    w = np.asarray(weights, dtype=np.int64).reshape(weights.shape[0], -1)
    return bool(w.size) and int(w.min()) >= -128 and int(w.max()) <= 127 and \
        int(np.abs(w).sum(axis=1).max()) * (hi - lo) < 2**31


# ---------------------------------------------------------------- fixed-point convolution


def fixed_sum_type(x: CType, w: CType, y: CType, taps: int, shift: int) -> str:
    """int32 when one input channel's sum plus a stored output cannot overflow it (and the
    truncating shift is narrower than 32 bits), else int64."""
    worst = (1 << (x.bits - 1)) * (1 << (w.bits - 1)) * taps + (1 << (y.bits - 1))
    return "int32_t" if worst < 2**31 and shift < 31 else "int64_t"


def _fixed_truncate(sum_t: str, unsigned: str, wide: str, upscale: bool, y: CType, width: str) -> str:
    """One input channel's sums truncated toward zero by 2^rs (or multiplied by ls) and added to the
    running totals, saturated to the output type; the sums cleared for the next channel."""
    return f"""for (q = 0; q < QCC_FB; ++q) {{
    for (j = 0; j < {width}; ++j) {{
        const {sum_t} v = s[q][j];
        const {sum_t} m = ({sum_t})(({unsigned})(v < 0 ? -v : v) >> rs);
        const {wide} r = ({wide})(v < 0 ? -m : m){' * ls' if upscale else ''} + total[q][j];
        total[q][j] = (int32_t)(r < {y.lo} ? {y.lo} : (r > {y.hi} ? {y.hi} : r));
        s[q][j] = 0;
    }}
}}
"""


def _fixed_plane(x: CType, w: CType, y: CType, ep: Epilogue, sum_t: str, unsigned: str, wide: str,
                 upscale: bool) -> str:
    """conv_fixed's plane path (one sample): pad every channel, then blocks of QCC_FXV padded
    positions by QCC_FB output channels, the input channels innermost but one (the taps)."""
    weights = "\n".join(f"const {sum_t} w{q} = wt[{q} * cg * ks];" for q in range(FB))
    macs = "\n".join(f"    s[{q}][j] += xv * w{q};" for q in range(FB))
    body = f"""for (ic = 0; ic < p->c; ++ic) {{
    /* channel ic zero-padded: plane row iy + ph holds input row iy, column ix + pw input column ix */
    const {x.name} *restrict xc = x + ((long)n * p->c + ic) * p->h * p->w;
    {x.name} *restrict pc = buf + ic * ps;
    int iy, ix;
    for (t = 0; t < ps; ++t) {{
        pc[t] = 0;
    }}
    for (iy = 0; iy < p->h; ++iy) {{
        const long row = (long)(iy + p->ph) * pw_;
        if (iy + p->ph < 0 || row + pw_ > ps) {{
            continue;
        }}
        for (ix = 0; ix < p->w; ++ix) {{
            if (ix + p->pw >= 0 && ix + p->pw < pw_) {{
                pc[row + ix + p->pw] = xc[(long)iy * p->w + ix];
            }}
        }}
    }}
}}
for (o = 0; o < p->o; o += nb) {{
    const int g = o / og;
    int k0;
    nb = o % og + QCC_FB <= og ? QCC_FB : 1;
    for (k0 = 0; k0 < nq; k0 += QCC_FXV) {{
        int32_t total[QCC_FB][QCC_FXV];
        {sum_t} s[QCC_FB][QCC_FXV];
        for (q = 0; q < QCC_FB; ++q) {{
            for (j = 0; j < QCC_FXV; ++j) {{
                total[q][j] = 0;
                s[q][j] = 0;
            }}
        }}
        for (ic = 0; ic < cg; ++ic) {{
            const {x.name} *restrict pc = buf + ((long)g * cg + ic) * ps + k0;
            const {w.name} *restrict wc = w + ((long)o * cg + ic) * ks;
            for (ky = 0; ky < p->kh; ++ky) {{
                for (kx = 0; kx < p->kw; ++kx) {{
                    const {x.name} *restrict xr = pc + (long)ky * p->dh * pw_ + kx * p->dw;
                    const {w.name} *restrict wt = wc + ky * p->kw + kx;
                    if (nb == QCC_FB) {{
{_indent(weights, 24)}                        for (j = 0; j < QCC_FXV; ++j) {{
                            const {sum_t} xv = xr[j];
{_indent(macs, 24)}                        }}
                    }} else {{
                        for (q = 0; q < nb; ++q) {{
                            const {sum_t} wq = wt[q * cg * ks];
                            for (j = 0; j < QCC_FXV; ++j) {{
                                s[q][j] += ({sum_t})xr[j] * wq;
                            }}
                        }}
                    }}
                }}
            }}
{_indent(_fixed_truncate(sum_t, unsigned, wide, upscale, y, "QCC_FXV"), 12)}        }}
        for (q = 0; q < nb; ++q) {{
            const int oc = o + q;
            {y.name} *restrict yc = y + ((long)n * p->o + oc) * p->oh * p->ow;
{_indent(ep.channel, 12)}            for (j = 0; j < QCC_FXV; ++j) {{
                const int oy_ = (k0 + j) / pw_;
                const int ox_ = k0 + j - oy_ * pw_;
                if (oy_ < p->oh && ox_ < p->ow) {{
                    const int32_t v = total[q][j];
{_indent(ep.full, 20)}                    yc[(long)oy_ * p->ow + ox_] = ({y.name})r;
                }}
            }}
        }}
    }}
}}
"""
    return _indent(body, 12)


def conv_fixed(ks: KernelSet, x: CType, w: CType, y: CType, ep: Epilogue, taps: int, shift: int) -> str:
    """nnabla-c-runtime's convolution (qcc.sim.fixed.conv_kernel): per input channel the exact sum of
    its taps, truncated toward zero by 2^shift (a negative shift multiplies), added to the running
    total saturated to the output type; then the epilogue.

    The truncation after every input channel is not associative, so the loops keep the channel
    order and vectorize along the output row instead: chunks of QCC_CHUNK positions (QCC_NARROW on
    narrow maps) for QCC_FB output channels at once, the input row read in place (stride 1) or
    from a zero-padded copy, fixed-length inner loops over the chunk. Weights: OIHW as stored.

    Small maps of stride 1 (every input channel's zero-padded plane together at most QCC_FXPLANE
    elements) take the plane path instead: the sample's channels are padded once, and each tap of a
    block of QCC_FXV positions (counted along the padded rows, so that a tap reads one contiguous
    run) is one vector multiply-add per output channel, the QCC_FB x QCC_FXV sums and totals in
    registers across all input channels. On 8x8 maps the row path spent its time padding 10-byte
    rows and in loops of 8; same sums, same order, same bits."""
    sum_t = fixed_sum_type(x, w, y, taps, shift)
    upscale = shift < 0
    flavour = f"{'_s64' if sum_t == 'int64_t' else ''}{'_up' if upscale else ''}"
    name = f"qcc_conv_{x.suffix}_{w.suffix}_{y.suffix}{flavour}{ep.suffix}"
    for helper in ep.helpers:
        ks.helper(helper)
    unsigned = "uint32_t" if sum_t == "int32_t" else "uint64_t"
    wide = "int64_t" if upscale or sum_t == "int64_t" else "int32_t"
    macs = "\n".join(f"                                    s[{q}][j] += xv * w{q};" for q in range(FB))
    weights = "\n".join(f"                                    const {sum_t} w{q} = wt[{q} * cg * ks];"
                         for q in range(FB))
    chunk = f"""                    int32_t total[QCC_FB][CW];
                    {sum_t} s[QCC_FB][CW];
                    for (q = 0; q < QCC_FB; ++q) {{
                        for (j = 0; j < CW; ++j) {{
                            total[q][j] = 0;
                            s[q][j] = 0;
                        }}
                    }}
                    for (ic = 0; ic < cg; ++ic) {{
                        const {x.name} *restrict xc = x + ((long)n * p->c + (long)g * cg + ic) * p->h * p->w;
                        const {w.name} *restrict wc = w + ((long)o * cg + ic) * ks;
                        for (ky = 0; ky < p->kh; ++ky) {{
                            const int iy = iy0 + ky * p->dh;
                            const {x.name} *restrict xr;
                            if (iy < 0 || iy >= p->h) {{
                                continue;
                            }}
                            xr = xc + (long)iy * p->w;
                            if (rowbuf) {{
                                /* stride 1: the chunk's input row in place when it lies inside the
                                   row, else a zero-padded copy */
                                {x.name} rb[CW + QCC_SPAN];
                                const int lo = c0 - p->pw;
                                const {x.name} *restrict row = rb;
                                if (lo >= 0 && lo + CW + span <= p->w) {{
                                    row = xr + lo;
                                }} else {{
                                    for (t = 0; t < CW + span; ++t) {{
                                        rb[t] = lo + t >= 0 && lo + t < p->w ? xr[lo + t] : 0;
                                    }}
                                }}
                                for (kx = 0; kx < p->kw; ++kx) {{
                                    const {x.name} *restrict r = row + kx * p->dw;
                                    const {w.name} *restrict wt = wc + ky * p->kw + kx;
                                    if (nb == QCC_FB) {{
{weights}
                                        for (j = 0; j < CW; ++j) {{
                                            const {sum_t} xv = r[j];
{macs}
                                        }}
                                    }} else {{
                                        for (q = 0; q < nb; ++q) {{
                                            const {sum_t} wq = wt[q * cg * ks];
                                            for (j = 0; j < CW; ++j) {{
                                                s[q][j] += ({sum_t})r[j] * wq;
                                            }}
                                        }}
                                    }}
                                }}
                                continue;
                            }}
                            for (kx = 0; kx < p->kw; ++kx) {{
                                const int off = kx * p->dw - p->pw;
                                const {w.name} *restrict wt = wc + ky * p->kw + kx;
                                int j0 = off >= 0 ? 0 : (-off + p->sw - 1) / p->sw;
                                int j1 = off >= p->w ? 0 : (p->w - off + p->sw - 1) / p->sw;
                                j0 = j0 > c0 ? j0 : c0;
                                j1 = j1 < c1 ? j1 : c1;
                                for (q = 0; q < nb; ++q) {{
                                    const {sum_t} wq = wt[q * cg * ks];
                                    for (j = j0; j < j1; ++j) {{
                                        s[q][j - c0] += ({sum_t})xr[j * p->sw + off] * wq;
                                    }}
                                }}
                            }}
                        }}
                        for (q = 0; q < nb; ++q) {{
                            for (j = 0; j < CW; ++j) {{
                                const {sum_t} v = s[q][j];
                                const {sum_t} m = ({sum_t})(({unsigned})(v < 0 ? -v : v) >> rs);
                                const {wide} r = ({wide})(v < 0 ? -m : m){' * ls' if upscale else ''} + total[q][j];
                                total[q][j] = (int32_t)(r < {y.lo} ? {y.lo} : (r > {y.hi} ? {y.hi} : r));
                                s[q][j] = 0;
                            }}
                        }}
                    }}
                    for (q = 0; q < nb; ++q) {{
                        const int oc = o + q;
                        {y.name} *restrict yr = y + (((long)n * p->o + oc) * p->oh + oy) * p->ow + c0;
{_indent(ep.channel, 24)}                        for (j = 0; j < c1 - c0; ++j) {{
                            const int32_t v = total[q][j];
{_indent(ep.full, 28)}                            yr[j] = ({y.name})r;
                        }}
                    }}
"""
    plane_body = _fixed_plane(x, w, y, ep, sum_t, unsigned, wide, upscale)
    params = "".join(f", {p}" for p in ep.params)
    return ks.kernel(name, lambda: f"""
static void {name}(const {x.name} *restrict x, const {w.name} *restrict w, const {y.name} *restrict b,
    {y.name} *restrict y, const qcc_conv_t *restrict p, int shift{params})
{{
    const int rs = shift > 0 ? shift : 0;
    const {wide} ls = shift < 0 ? ({wide})1 << -shift : 1;
    const int cg = p->c / p->group;
    const int og = p->o / p->group;
    const long ks = (long)p->kh * p->kw;
    const int span = (p->kw - 1) * p->dw;
    const int rowbuf = p->sw == 1 && span <= QCC_SPAN;
    int n, o, oy, c0, ic, ky, kx, j, q, nb, t;
#if QCC_FXPLANE > 0
    /* the plane path: rows of pw_ = ow + (kw - 1) * dw padded columns; output position k of the
       padded layout (oy * pw_ + ox) reads tap (ky, kx) at k + ky * dh * pw_ + kx * dw */
    const int pw_ = p->ow + (p->kw - 1) * p->dw;
    const int nq = (p->oh * pw_ + QCC_FXV - 1) / QCC_FXV * QCC_FXV;
    const long ps = nq + (long)(p->kh - 1) * p->dh * pw_ + (p->kw - 1) * p->dw;
    const int plane = p->sh == 1 && p->sw == 1 && p->c * ps <= QCC_FXPLANE;
    {x.name} buf[QCC_FXPLANE > 0 ? QCC_FXPLANE : 1];
#endif
    (void)ls;
    for (n = 0; n < p->n; ++n) {{
#if QCC_FXPLANE > 0
        if (plane) {{
{plane_body}            continue;
        }}
#endif
        for (o = 0; o < p->o; o += nb) {{
            const int g = o / og;
            nb = o % og + QCC_FB <= og ? QCC_FB : 1;
            for (oy = 0; oy < p->oh; ++oy) {{
                const int iy0 = oy * p->sh - p->ph;
                for (c0 = 0; c0 < p->ow; c0 += QCC_CHUNK) {{
                    const int c1 = c0 + QCC_CHUNK < p->ow ? c0 + QCC_CHUNK : p->ow;
                    if (c1 - c0 <= QCC_NARROW) {{
{chunk.replace("CW", "QCC_NARROW")}                    }} else {{
{chunk.replace("CW", "QCC_CHUNK")}                    }}
                }}
            }}
        }}
    }}
}}
""", ("conv_t",))


# ---------------------------------------------------------------- depthwise convolution


def depthwise(ks: KernelSet, x: CType, w: CType, y: CType, ep: Epilogue, mode: str, taps: int = 1,
              shift: int = 0) -> str:
    """One input channel per output channel: along each output row, QCC_ROW sums at a time; each tap
    adds its weight times the input positions inside the row (the padding's zeros are skipped, not
    copied), in a loop specialized for stride 1 and 2 so that the loads are contiguous or of a fixed
    stride and vectorize (a row copy per tap, gathered at the layer's runtime stride, was 40 % of
    ShuffleNet float). Integer sums do not depend on the order; float skips only +-0 terms.

    `mode` float / affine (sums of x - zx) / fixed (one channel's sum, truncated and saturated once)."""
    fixed = mode == "fixed"
    upscale = shift < 0
    sum_t = fixed_sum_type(x, w, y, taps, shift) if fixed else ("float" if mode == "float" else "int32_t")
    flavour = f"{'_s64' if sum_t == 'int64_t' else ''}{'_up' if upscale else ''}" if fixed else ""
    name = f"qcc_dwconv_{x.suffix}_{w.suffix}_{y.suffix}{flavour}{ep.suffix}" if mode != "float" else \
        f"qcc_dwconv_f32{ep.suffix}"
    for helper in ep.helpers:
        ks.helper(helper)
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
    elem = "float" if mode == "float" else ("int16_t" if mode == "affine" else x.name)
    plane_value = value.replace("xr[ix]", "xr[c * s - a]")
    taps_loop = "".join(
        f"{'if' if i == 0 else '} else if'} ({cond}) {{\n"
        f"    for (q = lo; q < hi; ++q) {{\n        acc[q] += ({sum_t}){value.replace('ix', index)} * wv;\n    }}\n"
        for i, (cond, index) in enumerate((("p->sw == 1", "(ix0 + q)"), ("p->sw == 2", "(ix0 + 2 * q)"),
                                           ("1", "(ix0 + q * p->sw)")))) + "}\n"
    return ks.kernel(name, lambda: f"""
QCC_DISPATCH static void {name}(const {x.name} *restrict x, const {w.name} *restrict w{bias_param}, {y.name} *restrict y,
    const qcc_conv_t *restrict p{extra}{''.join(f', {p}' for p in ep.params)})
{{
    {prologue}const int khw = p->kh * p->kw;
    int n, oc, oy, ox0, ky, kx, q;
#if QCC_DWPLANE > 0
    /* the plane path: padded rows hp x wp (even for stride 2) split into s x s phase planes of
       hq x pq, so that every tap reads one contiguous run of the plane of its phase */
    const int s = p->sw;
    const int hp = ((p->oh - 1) * s + p->kh + s - 1) / s * s;
    const int wp = ((p->ow - 1) * s + p->kw + s - 1) / s * s;
    const int hq = hp / s, pq = wp / s;
    const int plane = p->sh == s && (s == 1 || s == 2) && p->dh == 1 && p->dw == 1 &&
        (long)hp * wp + QCC_DWV <= QCC_DWPLANE;
    /* whole blocks of QCC_DWV sums: a short plane (7 x 9) would otherwise spend its time in the
       vector loop's scalar remainder; the plane's zeroed tail keeps the extra sums finite */
    const int len = ((p->oh - 1) * pq + p->ow + QCC_DWV - 1) / QCC_DWV * QCC_DWV;
    {elem} buf[QCC_DWPLANE];
    {sum_t} sums[QCC_DWPLANE];
#endif
    for (n = 0; n < p->n; ++n) {{
        for (oc = 0; oc < p->o; ++oc) {{
            const {x.name} *restrict xp = x + ((long)n * p->c + oc) * p->h * p->w;
            const {w.name} *restrict wc = w + (long)oc * khw;
{_indent(ep.channel, 12)}#if QCC_DWPLANE > 0
            if (plane) {{
                int ry, rx, r, c, j, t;
                for (j = hp * wp; j < hp * wp + QCC_DWV; ++j) {{
                    buf[j] = 0;
                }}
                for (ry = 0; ry < s; ++ry) {{
                    for (rx = 0; rx < s; ++rx) {{
                        {elem} *restrict ph = buf + (ry * s + rx) * hq * pq;
                        const int a = p->pw - rx;
                        const int c0 = a > 0 ? (a + s - 1) / s : 0;
                        const int c1r = p->w - 1 + a < 0 ? 0 : (p->w - 1 + a) / s + 1;
                        const int c1 = c1r < pq ? c1r : pq;
                        for (r = 0; r < hq; ++r) {{
                            const int iy = r * s + ry - p->ph;
                            {elem} *restrict pr = ph + r * pq;
                            if (iy < 0 || iy >= p->h || c1 <= c0) {{
                                for (c = 0; c < pq; ++c) {{
                                    pr[c] = 0;
                                }}
                                continue;
                            }}
                            {{
                                const {x.name} *restrict xr = xp + (long)iy * p->w;
                                for (c = 0; c < c0; ++c) {{
                                    pr[c] = 0;
                                }}
                                if (s == 1) {{
                                    for (c = c0; c < c1; ++c) {{
                                        pr[c] = {plane_value.replace("c * s - a", "c - a")};
                                    }}
                                }} else {{
                                    for (c = c0; c < c1; ++c) {{
                                        pr[c] = {plane_value};
                                    }}
                                }}
                                for (c = c1; c < pq; ++c) {{
                                    pr[c] = 0;
                                }}
                            }}
                        }}
                    }}
                }}
                for (j = 0; j < len; ++j) {{
                    sums[j] = {zero};
                }}
                for (ky = 0; ky < p->kh; ++ky) {{
                    for (kx = 0; kx < p->kw; ++kx) {{
                        const {sum_t} wv = wc[ky * p->kw + kx];
                        const {elem} *restrict src = buf + ((ky % s) * s + kx % s) * hq * pq + (ky / s) * pq + kx / s;
                        for (j = 0; j < len; j += QCC_DWV) {{
                            for (t = 0; t < QCC_DWV; ++t) {{
                                sums[j + t] += ({sum_t})src[j + t] * wv;
                            }}
                        }}
                    }}
                }}
                for (oy = 0; oy < p->oh; ++oy) {{
                    {y.name} *restrict yr = y + (((long)n * p->o + oc) * p->oh + oy) * p->ow;
                    const {sum_t} *restrict acc = sums + oy * pq;
                    for (q = 0; q < p->ow; ++q) {{
{_indent(finish, 24)}{_indent(ep.full, 24)}                        yr[q] = ({y.name})r;
                    }}
                }}
                continue;
            }}
#endif
            for (oy = 0; oy < p->oh; ++oy) {{
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
                            const int lo = ix0 < 0 ? (-ix0 + p->sw - 1) / p->sw : 0;
                            const int last = ix0 > p->w - 1 ? 0 : (p->w - 1 - ix0) / p->sw + 1;
                            const int hi = last < pn ? last : pn;
{_indent(taps_loop, 28)}                        }}
                    }}
                    for (q = 0; q < pn; ++q) {{
{_indent(finish, 24)}{_indent(ep.full, 24)}                        yr[ox0 + q] = ({y.name})r;
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
    (k mod 4) keep four independent chains. Float, or fixed point (`mode` "fixed": the exact sum
    truncated once, qcc.sim.fixed.dense_kernel); affine Dense runs as a 1x1 `conv_affine`."""
    if mode == "float":
        name, acc, value = f"qcc_dense_f32{ep.suffix}", "float", "xi[t]"
        extra, bias_param, finish = "", ", const float *restrict b", ""
    else:
        name, acc, value = f"qcc_dense_{x.suffix}_{w.suffix}_{y.suffix}{ep.suffix}", "int64_t", "(int64_t)xi[t]"
        extra, bias_param = ", int shift", f", const {y.name} *restrict b"
        finish = "sum = qcc_sat(qcc_shift(sum, shift), LO, HI);\n".replace("LO", str(y.lo)).replace("HI", str(y.hi))
        ks.helper("sat")
        ks.helper("shift")
    for helper in ep.helpers:
        ks.helper(helper)
    sum_t = "float" if mode == "float" else "int64_t"
    v_t = "float" if mode == "float" else "int32_t"
    if mode == "float":
        ks.helper("madd")
        mac, mac0 = "QCC_MADD(xv, wk[o], a[u][o])", "QCC_MADD(xv, wk[o], a[0][o])"
    else:
        mac, mac0 = "a[u][o] + xv * wk[o]", "a[0][o] + xv * wk[o]"
    return ks.kernel(name, lambda: f"""
QCC_DISPATCH static void {name}(const {x.name} *restrict x, const {w.name} *restrict w{bias_param}, {y.name} *restrict y,
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
                        a[u][o] = {mac};
                    }}
                }}
            }}
            for (t = k4; t < k; ++t) {{
                const {acc} xv = {value};
                const {w.name} *restrict wk = wb + t * QCC_OB;
                for (o = 0; o < QCC_OB; ++o) {{
                    a[0][o] = {mac0};
                }}
            }}
            for (o = 0; o < QCC_OB && ob * QCC_OB + o < m; ++o) {{
                const long oc = ob * QCC_OB + o;
                {sum_t} sum = a[0][o] + a[1][o];
                {v_t} v;
                sum += a[2][o] + a[3][o];
{_indent(finish, 16)}                v = ({v_t})sum;
                {{
{_indent(ep.channel, 20)}{_indent(ep.full, 20)}                    y[i * m + oc] = ({y.name})r;
                }}
            }}
        }}
    }}
}}
""", ("conv_t",))


def conv_transpose_f32(ks: KernelSet) -> str:
    return ks.kernel("qcc_convt_f32", lambda: conv_transpose_source("qcc_convt_f32", FLOAT, FLOAT, FLOAT),
                     ("conv_t",))


def conv_transpose_affine(ks: KernelSet, x: CType, w: CType, y: CType) -> str:
    name = f"qcc_convt_{x.suffix}_{w.suffix}_{y.suffix}"
    return ks.kernel(name, lambda: conv_transpose_source(name, x, w, y), ("conv_t", "requant"))


def conv_transpose_source(name: str, x: CType, w: CType, y: CType) -> str:
    """Transposed convolution gathered per output element: the input element each tap reads is
    (o + pad - k * dilation) / stride where that divides exactly and lies inside the map (no
    padding is read, so the affine sum needs no zero-point fill). Weight (C, O/group, KH, KW).
    Float: one rounding per product and per sum. Affine: int32 sums of (x - zx) * w started at
    the bias, requantized per output channel (qcc.sim.affine_int.conv_transpose_kernel)."""
    affine = y.affine is not None
    acc = "int32_t" if affine else "float"
    bias_t = "int32_t" if affine else "float"
    init = "b[o]" if affine else "b != NULL ? b[o] : 0.0f"
    xv = "((int32_t)xc[iy * p->w + ix] - zx)" if affine else "xc[iy * p->w + ix]"
    store = f"({y.name})qcc_requant(acc, mult[o], shift[o], zy, {y.lo}, {y.hi})" if affine else "acc"
    extra = ", int32_t zx, const int32_t *restrict mult, const int32_t *restrict shift, int32_t zy" if affine else ""
    return f"""
static void {name}(const {x.name} *restrict x, const {w.name} *restrict w, const {bias_t} *restrict b,
    {y.name} *restrict y, const qcc_conv_t *restrict p{extra})
{{
    const int cg = p->c / p->group;
    const int og = p->o / p->group;
    const long ks = (long)p->kh * p->kw;
    int n, o, oy, ox, ic, ky, kx;
    for (n = 0; n < p->n; ++n) {{
        for (o = 0; o < p->o; ++o) {{
            const int g = o / og;
            const int j = o % og;
            {y.name} *yo = y + ((long)n * p->o + o) * p->oh * p->ow;
            for (oy = 0; oy < p->oh; ++oy) {{
                for (ox = 0; ox < p->ow; ++ox) {{
                    {acc} acc = {init};
                    for (ic = 0; ic < cg; ++ic) {{
                        const int c = g * cg + ic;
                        const {x.name} *xc = x + ((long)n * p->c + c) * p->h * p->w;
                        const {w.name} *wc = w + ((long)c * og + j) * ks;
                        for (ky = 0; ky < p->kh; ++ky) {{
                            const int ty = oy + p->ph - ky * p->dh;
                            int iy;
                            if (ty < 0 || ty % p->sh != 0) {{
                                continue;
                            }}
                            iy = ty / p->sh;
                            if (iy >= p->h) {{
                                continue;
                            }}
                            for (kx = 0; kx < p->kw; ++kx) {{
                                const int tx = ox + p->pw - kx * p->dw;
                                int ix;
                                if (tx < 0 || tx % p->sw != 0) {{
                                    continue;
                                }}
                                ix = tx / p->sw;
                                if (ix < p->w) {{
                                    const {acc} t = {xv} * ({acc})wc[ky * p->kw + kx];
                                    acc += t;
                                }}
                            }}
                        }}
                    }}
                    yo[(long)oy * p->ow + ox] = {store};
                }}
            }}
        }}
    }}
}}
"""
