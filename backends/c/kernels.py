"""C source of the kernels, generated per element-type combination; only used ones are emitted.

Integer kernels reproduce `qcc.sim.fixed` exactly: int64 sums, truncation toward zero by C
division, saturation, the runtime's saturating add. Float code writes one operation per
statement where a multiply meets an add, so no compiler contracts it into an FMA under the
default C99 rules; the fixed-point generic kernels (float32 between getter and setter) depend on
that and on FLT_EVAL_METHOD == 0 (checked at compile time).
"""

from __future__ import annotations

from collections.abc import Callable

from qcc.backends.c.ctype import FLOAT as FLOAT_T
from qcc.backends.c.ctype import CType, scale_params


def _saturating(name: str, op: str, high: str, low: str, doc: str) -> str:
    """The runtime's sum_sat/sub_sat: wrap, then saturate only on the overflow patterns it tests."""
    return f"""
/* {doc} */
static int32_t {name}(int32_t a, int32_t b, int bits)
{{
    const int32_t r = qcc_wrap((int64_t)a {op} b, bits);
    if ({high}) {{
        return ((int32_t)1 << (bits - 1)) - 1;
    }}
    if ({low}) {{
        return -((int32_t)1 << (bits - 1));
    }}
    return r;
}}
"""


HELPERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sat": ("""
static int32_t qcc_sat(int64_t v, int32_t lo, int32_t hi)
{
    return v < lo ? lo : (v > hi ? hi : (int32_t)v);
}
""", ()),
    "shift": ("""
/* v * 2^-n truncated toward zero (C division by 2^n, done with unsigned shifts); n < 0 multiplies. */
static int64_t qcc_shift(int64_t v, int n)
{
    if (n > 0) {
        return v >= 0 ? (int64_t)((uint64_t)v >> n) : -(int64_t)((uint64_t)-v >> n);
    }
    if (n < 0) {
        return v * ((int64_t)1 << -n);
    }
    return v;
}
""", ()),
    "wrap": ("""
/* Two's-complement wrap to `bits` bits, without implementation-defined conversions. */
static int32_t qcc_wrap(int64_t v, int bits)
{
    const uint32_t m = (uint32_t)1 << bits;
    const uint32_t u = (uint32_t)((uint64_t)v & (m - 1u));
    return u >= (m >> 1) ? (int32_t)u - (int32_t)m : (int32_t)u;
}
""", ()),
    "sat_add": (_saturating("qcc_sat_add", "+", "a > 0 && b > 0 && r < 0", "a < 0 && b < 0 && r > 0",
                            "nnabla-c-runtime's saturating add: overflow saturates, MIN + MIN wraps to 0."), ("wrap",)),
    "sat_sub": (_saturating("qcc_sat_sub", "-", "r < 0 && a > 0 && b < 0", "r > 0 && a < 0 && b > 0",
                            "nnabla-c-runtime's saturating subtract: 0 - MIN gives MIN."), ("wrap",)),
    "store": ("""
/* The setter: v * 2^frac (scale, exact) truncated toward zero and saturated; NaN stores 0. */
static int32_t qcc_store(float v, float scale, int32_t lo, int32_t hi)
{
    const float t = v * scale;
    if (t != t) {
        return 0;
    }
    if (t >= (float)hi) {
        return hi;
    }
    if (t <= (float)lo) {
        return lo;
    }
    return (int32_t)t;
}
""", ()),
    "rint": ("""
/* t rounded half to even (t finite and inside the int32 range). */
static int32_t qcc_rint(float t)
{
    int32_t i = (int32_t)t;
    const float r = t - (float)i;
    if (r > 0.5f || (r == 0.5f && (i & 1) != 0)) {
        i += 1;
    } else if (r < -0.5f || (r == -0.5f && (i & 1) != 0)) {
        i -= 1;
    }
    return i;
}
""", ()),
    "round": ("""
/* Input quantization: v * 2^frac rounded half to even, saturated; NaN gives 0. */
static int32_t qcc_round(float v, float scale, int32_t lo, int32_t hi)
{
    const float t = v * scale;
    if (t != t) {
        return 0;
    }
    if (t >= (float)hi) {
        return hi;
    }
    if (t <= (float)lo) {
        return lo;
    }
    return qcc_rint(t);
}
""", ("rint",)),
    "expf": ("""
/* exp rounded once from double precision (qcc.sim.fixed.exp_f32). */
static float qcc_expf(float v)
{
    return (float)exp((double)v);
}
""", ()),
    "tanhf": ("""
static float qcc_tanhf(float v)
{
    return (float)tanh((double)v);
}
""", ()),
    "bcast": ("""
/* Output index -> input indices of a broadcasting binary op (dims of size 1 have stride 0). */
typedef struct {
    int rank;
    long shape[QCC_MAX_RANK];
    long sa[QCC_MAX_RANK];
    long sb[QCC_MAX_RANK];
} qcc_bcast_t;

static void qcc_bcast_next(const qcc_bcast_t *p, long *idx, long *ia, long *ib)
{
    int d;
    for (d = p->rank - 1; d >= 0; --d) {
        *ia += p->sa[d];
        *ib += p->sb[d];
        if (++idx[d] < p->shape[d]) {
            return;
        }
        *ia -= p->sa[d] * p->shape[d];
        *ib -= p->sb[d] * p->shape[d];
        idx[d] = 0;
    }
}
""", ()),
    "perm": ("""
/* Transpose: output shape and, per output axis, the input stride it walks. */
typedef struct {
    int rank;
    long shape[QCC_MAX_RANK];
    long stride[QCC_MAX_RANK];
} qcc_perm_t;
""", ()),
    "conv_t": ("""
#define QCC_CHUNK 32 /* output positions per row chunk (stack accumulators) */
#define QCC_NARROW 8 /* chunk length for maps of at most this width */
#define QCC_SPAN 32 /* widest (kw - 1) * dilation served by the zero-padded row buffer */

typedef struct {
    int n, c, h, w, o, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, group;
} qcc_conv_t;
""", ()),
    "pool_t": ("""
/* Pooling window: begin pads ph/pw, end pads eh/ew (count_include_pad counts them). */
typedef struct {
    int n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, eh, ew, include_pad;
} qcc_pool_t;
""", ()),
}

HELPERS.update({
    "requant": ("""
/* zp + v * m / 2^s rounded half away from zero, saturated to [lo, hi] (|v * m| < 2^62). */
static int32_t qcc_requant(int64_t v, int64_t m, int s, int32_t zp, int32_t lo, int32_t hi)
{
    const int64_t prod = v * m;
    uint64_t mag = prod < 0 ? (uint64_t)0 - (uint64_t)prod : (uint64_t)prod;
    int64_t r;
    if (s > 0) {
        mag = (mag + ((uint64_t)1 << (s - 1))) >> s;
    }
    r = prod < 0 ? -(int64_t)mag : (int64_t)mag;
    return qcc_sat(r + zp, lo, hi);
}
""", ("sat",)),
    "quantize": ("""
/* zp + v / scale rounded half to even, saturated to [lo, hi]; NaN gives zp. */
static int32_t qcc_quantize(float v, float scale, int32_t zp, int32_t lo, int32_t hi)
{
    const float t = v / scale;
    if (t != t) {
        return zp;
    }
    if (t <= (float)(lo - zp)) {
        return lo;
    }
    if (t >= (float)(hi - zp)) {
        return hi;
    }
    return qcc_rint(t) + zp;
}
""", ("rint",)),
    "minmax": ("""
static int32_t qcc_max(int32_t a, int32_t b)
{
    return a > b ? a : b;
}

static int32_t qcc_min(int32_t a, int32_t b)
{
    return a < b ? a : b;
}
""", ()),
})
"""Affine mode (qcc.sim.affine_int): requantization, quantization, comparison."""

MATH_HELPERS = frozenset({"expf", "tanhf"})


class KernelSet:
    """The helpers and kernels one model needs, in dependency order."""

    def __init__(self) -> None:
        self.code: dict[str, str] = {}
        self.uses_math = False

    def helper(self, name: str) -> None:
        if name in self.code:
            return
        code, deps = HELPERS[name]
        for dep in deps:
            self.helper(dep)
        self.uses_math |= name in MATH_HELPERS
        self.code[name] = code

    def kernel(self, name: str, make: Callable[[], str], helpers: tuple[str, ...] = ()) -> str:
        for helper in helpers:
            self.helper(helper)
        if name not in self.code:
            self.code[name] = make()
        return name

    def source(self) -> str:
        return "".join(self.code.values())


def _sig(name: str, params: list[str]) -> str:
    return f"static void {name}({', '.join(params)})"


# ---------------------------------------------------------------- float-only kernels


def conv_f32(ks: KernelSet) -> str:
    return ks.kernel("qcc_conv_f32", lambda: _conv_source("qcc_conv_f32", FLOAT_T, FLOAT_T, FLOAT_T),
                     ("conv_t",))


def dense_f32(ks: KernelSet) -> str:
    return ks.kernel("qcc_dense_f32", lambda: """
/* y = x (n, k) @ w (k, m) + b */
static void qcc_dense_f32(const float *x, const float *w, const float *b, float *y, long n, long k, long m)
{
    long i, j, t;
    for (i = 0; i < n; ++i) {
        float *yi = y + i * m;
        for (j = 0; j < m; ++j) {
            yi[j] = b != NULL ? b[j] : 0.0f;
        }
        for (t = 0; t < k; ++t) {
            const float xv = x[i * k + t];
            const float *wr = w + t * m;
            for (j = 0; j < m; ++j) {
                const float p = xv * wr[j];
                yi[j] += p;
            }
        }
    }
}
""")


def lrn_f32(ks: KernelSet) -> str:
    ks.uses_math = True
    return ks.kernel("qcc_lrn_f32", lambda: """
static void qcc_lrn_f32(const float *x, float *y, int n, int c, long inner, int size, float alpha,
                        float beta, float bias)
{
    const int lo = (size - 1) / 2;
    const int hi = size - 1 - lo;
    int b, ch, cc;
    long i;
    for (b = 0; b < n; ++b) {
        for (ch = 0; ch < c; ++ch) {
            const int c0 = ch - lo < 0 ? 0 : ch - lo;
            const int c1 = ch + hi > c - 1 ? c - 1 : ch + hi;
            for (i = 0; i < inner; ++i) {
                float s = 0.0f;
                float d;
                for (cc = c0; cc <= c1; ++cc) {
                    const float v = x[((long)b * c + cc) * inner + i];
                    const float sq = v * v;
                    s += sq;
                }
                d = alpha / (float)size;
                d = d * s;
                d = bias + d;
                y[((long)b * c + ch) * inner + i] =
                    x[((long)b * c + ch) * inner + i] / (float)pow((double)d, (double)beta);
            }
        }
    }
}
""")


# ---------------------------------------------------------------- integer-only kernels


def conv_fixed(ks: KernelSet, x: CType, w: CType, y: CType, pointwise: bool = False) -> str:
    """`pointwise` (1x1 kernels): one product per channel fits int32 even at 16 bits."""
    name = f"qcc_conv{'1x1' if pointwise else ''}_{x.suffix}_{w.suffix}_{y.suffix}"
    return ks.kernel(name, lambda: _conv_source(name, x, w, y, pointwise), ("conv_t", "sat_add"))


def _conv_source(name: str, x: CType, w: CType, y: CType, pointwise: bool = False) -> str:
    """Direct convolution over chunks of one output row for up to 4 output channels at once.

    Float: accumulate every tap into the chunk. Fixed (qcc.sim.fixed.conv_kernel): per input
    channel sum the taps exactly, truncate by 2**shift, add to the saturated running total; then
    the bias with the runtime's saturating add.
    """
    affine = y.affine is not None
    fixed = y.fixed is not None
    narrow = (x.bits == 8 and w.bits == 8) or pointwise
    acc = "float" if not y.is_int else ("int32_t" if narrow or affine else "int64_t")
    target = "s" if fixed else "acc"
    pad, bias_t = ("zx", "int32_t") if affine else ("0", y.name)

    def xv(expr: str) -> str:
        """An input element as the sums read it (affine: minus its zero point)."""
        return f"(({acc}){expr} - zx)" if affine else f"({acc}){expr}"

    if affine:
        decl = "int32_t acc[4][CW];"
        init = "acc[q][j] = b[o + q];"
        per_ic = per_ic_end = ""
        store = f"yr[j] = ({y.name})qcc_requant(acc[q][j], mult[o + q], shift[o + q], zy, {y.lo}, {y.hi});"
        extra = ", int32_t zx, const int32_t *restrict mult, const int32_t *restrict shift, int32_t zy"
        prologue = ""
    elif fixed:
        decl = f"int32_t total[4][CW];\n                    {acc} s[4][CW];"
        init = "total[q][j] = 0;\n                            s[q][j] = 0;"
        per_ic = ""
        unsigned = "uint32_t" if narrow else "uint64_t"
        # qcc_shift + qcc_sat written out branch-free, clearing s for the next channel; a narrow
        # sum truncated by a non-negative shift plus an output value cannot overflow int32
        body = f"""const {acc} v = s[q][j];
                                const {acc} m = ({acc})(({unsigned})(v < 0 ? -v : v) >> rs);
                                const TYPE t = (TYPE)(v < 0 ? -m : m)SCALE + total[q][j];
                                total[q][j] = (int32_t)(t < {y.lo} ? {y.lo} : (t > {y.hi} ? {y.hi} : t));
                                s[q][j] = 0;"""
        wide = body.replace("TYPE", "int64_t").replace("SCALE", " * ls")
        fast = body.replace("TYPE", "int32_t" if narrow else "int64_t").replace("SCALE", "")
        per_ic_end = f"""for (q = 0; q < nb; ++q) {{
                            if (ls == 1) {{
                                for (j = 0; j < CW; ++j) {{
                                {fast}
                                }}
                            }} else {{
                                for (j = 0; j < CW; ++j) {{
                                {wide}
                                }}
                            }}
                        }}"""
        store = f"""int32_t t = total[q][j];
                            if (b != NULL) {{
                                t = qcc_sat_add(t, b[o + q], {y.bits});
                            }}
                            yr[j] = ({y.name})t;"""
        extra = ", int shift"
        prologue = ("const int rs = shift > 0 ? shift : 0;\n"
                    "    const int64_t ls = shift < 0 ? (int64_t)1 << -shift : 1;\n    ")
    else:
        decl = "float acc[4][CW];"
        init = "acc[q][j] = b != NULL ? b[o + q] : 0.0f;"
        per_ic = per_ic_end = ""
        store = "yr[j] = acc[q][j];"
        extra = prologue = ""
    taps4 = "\n".join(f"                                        {target}[{q}][j] += xv * w{q};" for q in range(4))
    # the chunk body, emitted twice: fixed-length loops of QCC_NARROW for narrow maps, else QCC_CHUNK
    chunk = f"""                    {decl}
                    for (q = 0; q < nb; ++q) {{
                        for (j = 0; j < CW; ++j) {{
                            {init}
                        }}
                    }}
                    for (ic = 0; ic < cg; ++ic) {{
                        const {x.name} *xc = x + ((long)n * p->c + (long)g * cg + ic) * p->h * p->w;
                        const {w.name} *wc = w + ((long)o * cg + ic) * ks;
                        {per_ic}
                        for (ky = 0; ky < p->kh; ++ky) {{
                            const int iy = iy0 + ky * p->dh;
                            const {x.name} *xr;
                            if (iy < 0 || iy >= p->h) {{
                                continue;
                            }}
                            xr = xc + (long)iy * p->w;
                            if (rowbuf) {{
                                /* stride 1: fixed-length loops over the chunk's input row, read in
                                   place when it lies inside the row, else from a zero-padded copy */
                                {x.name} rb[CW + QCC_SPAN];
                                const int lo = c0 - p->pw;
                                const {x.name} *row = rb;
                                if (lo >= 0 && lo + CW + span <= p->w) {{
                                    row = xr + lo;
                                }} else {{
                                    const int t0 = lo < 0 ? (-lo < CW + span ? -lo : CW + span) : 0;
                                    const int t1 = p->w - lo < CW + span ? p->w - lo : CW + span;
                                    for (t = 0; t < t0; ++t) {{
                                        rb[t] = {pad};
                                    }}
                                    for (t = t0; t < t1; ++t) {{
                                        rb[t] = xr[lo + t];
                                    }}
                                    for (t = t1 > t0 ? t1 : t0; t < CW + span; ++t) {{
                                        rb[t] = {pad};
                                    }}
                                }}
                                for (kx = 0; kx < p->kw; ++kx) {{
                                    const {x.name} *r = row + kx * p->dw;
                                    const {w.name} *wt = wc + ky * p->kw + kx;
                                    if (nb == 4) {{
                                        const {acc} w0 = wt[0];
                                        const {acc} w1 = wt[cg * ks];
                                        const {acc} w2 = wt[2 * cg * ks];
                                        const {acc} w3 = wt[3 * cg * ks];
                                        for (j = 0; j < CW; ++j) {{
                                            const {acc} xv = {xv("r[j]")};
{taps4}
                                        }}
                                    }} else {{
                                        const {acc} w0 = wt[0];
                                        for (j = 0; j < CW; ++j) {{
                                            {target}[0][j] += {xv("r[j]")} * w0;
                                        }}
                                    }}
                                }}
                                continue;
                            }}
                            for (kx = 0; kx < p->kw; ++kx) {{
                                const int off = kx * p->dw - p->pw;
                                const {w.name} *wt = wc + ky * p->kw + kx;
                                int j0 = off >= 0 ? 0 : (-off + p->sw - 1) / p->sw;
                                int j1 = off >= p->w ? 0 : (p->w - off + p->sw - 1) / p->sw;
                                j0 = j0 > c0 ? j0 : c0;
                                j1 = j1 < c1 ? j1 : c1;
                                for (q = 0; q < nb; ++q) {{
                                    const {acc} wq = wt[q * cg * ks];
                                    for (j = j0; j < j1; ++j) {{
                                        {target}[q][j - c0] += {xv("xr[j * p->sw + off]")} * wq;
                                    }}
                                }}
                            }}
                        }}
                        {per_ic_end}
                    }}
                    for (q = 0; q < nb; ++q) {{
                        {y.name} *yr = y + (((long)n * p->o + o + q) * p->oh + oy) * p->ow + c0;
                        for (j = 0; j < c1 - c0; ++j) {{
                            {store}
                        }}
                    }}
"""
    narrow_body = chunk.replace("CW", "QCC_NARROW")
    chunk_body = chunk.replace("CW", "QCC_CHUNK")
    return f"""
static void {name}(const {x.name} *restrict x, const {w.name} *restrict w, const {bias_t} *restrict b,
    {y.name} *restrict y, const qcc_conv_t *restrict p{extra})
{{
    {prologue}const int cg = p->c / p->group;
    const int og = p->o / p->group;
    const long ks = (long)p->kh * p->kw;
    const int span = (p->kw - 1) * p->dw;
    const int rowbuf = p->sw == 1 && span <= QCC_SPAN;
    int n, o, oy, c0, ic, ky, kx, j, q, nb, t;
    for (n = 0; n < p->n; ++n) {{
        for (o = 0; o < p->o; o += nb) {{
            const int g = o / og;
            nb = o % og + 4 <= og ? 4 : 1;
            for (oy = 0; oy < p->oh; ++oy) {{
                const int iy0 = oy * p->sh - p->ph;
                for (c0 = 0; c0 < p->ow; c0 += QCC_CHUNK) {{
                    const int c1 = c0 + QCC_CHUNK < p->ow ? c0 + QCC_CHUNK : p->ow;
                    if (c1 - c0 <= QCC_NARROW) {{
{narrow_body}                    }} else {{
{chunk_body}                    }}
                }}
            }}
        }}
    }}
}}
"""


def dense_fixed(ks: KernelSet, x: CType, w: CType, y: CType) -> str:
    """Weights are emitted transposed (m, k) so each sum reads contiguous rows."""
    name = f"qcc_dense_{x.suffix}_{w.suffix}_{y.suffix}"
    return ks.kernel(name, lambda: f"""
static void {name}(const {x.name} *x, const {w.name} *wt, const {y.name} *b, {y.name} *y,
    long n, long k, long m, int shift)
{{
    long i, j, t;
    for (i = 0; i < n; ++i) {{
        const {x.name} *xi = x + i * k;
        for (j = 0; j < m; ++j) {{
            const {w.name} *wj = wt + j * k;
            int64_t s = 0;
            int32_t r;
            for (t = 0; t < k; ++t) {{
                s += (int32_t)xi[t] * wj[t];
            }}
            r = qcc_sat(qcc_shift(s, shift), {y.lo}, {y.hi});
            if (b != NULL) {{
                r = qcc_sat_add(r, b[j], {y.bits});
            }}
            y[i * m + j] = ({y.name})r;
        }}
    }}
}}
""", ("sat", "shift", "sat_add"))


def quantize_input(ks: KernelSet, y: CType) -> str:
    name = f"qcc_quantize_{y.suffix}"
    return ks.kernel(name, lambda: f"""
static void {name}(const float *x, {y.name} *q, long n, float scale)
{{
    long i;
    for (i = 0; i < n; ++i) {{
        q[i] = ({y.name})qcc_round(x[i], scale, {y.lo}, {y.hi});
    }}
}}
""", ("round",))


def dequantize(ks: KernelSet, x: CType) -> str:
    name = f"qcc_dequantize_{x.suffix}"
    return ks.kernel(name, lambda: f"""
static void {name}(const {x.name} *q, float *y, long n, float xinv)
{{
    long i;
    for (i = 0; i < n; ++i) {{
        y[i] = (float)q[i] * xinv;
    }}
}}
""")


def requant(ks: KernelSet, x: CType, y: CType) -> str:
    """Views with a new annotation, Quantize: requantize every element (see _convert)."""
    name = f"qcc_requant_{x.suffix}_{y.suffix}"
    value, helpers, extra = _convert(x, y, "x[i]")
    params = [f"const {x.name} *x", f"{y.name} *y", "long n", *extra]
    return ks.kernel(name, lambda: f"""
{_sig(name, params)}
{{
    long i;
    for (i = 0; i < n; ++i) {{
        y[i] = {value};
    }}
}}
""", helpers)


def relu_fixed(ks: KernelSet, t: CType) -> str:
    name = f"qcc_relu_{t.suffix}"
    return ks.kernel(name, lambda: f"""
static void {name}(const {t.name} *x, {t.name} *y, long n, int shift)
{{
    long i;
    for (i = 0; i < n; ++i) {{
        const int32_t v = x[i] > 0 ? x[i] : 0;
        y[i] = ({t.name})qcc_sat(qcc_shift(v, shift), {t.lo}, {t.hi});
    }}
}}
""", ("sat", "shift"))


# ---------------------------------------------------------------- kernels for both modes


def _window(kind: str) -> str:
    """Pooling window bounds; `kind` 'avg' also computes the averaging count."""
    count = """
                    count = p->include_pad ? (long)(he - hs) * (we - ws) : 0;""" if kind == "avg" else ""
    clipped = """
                    if (!p->include_pad) {
                        count = (long)(he - hs) * (we - ws);
                    }""" if kind == "avg" else ""
    return f"""
                    int hs = oy * p->sh - p->ph;
                    int ws = ox * p->sw - p->pw;
                    int he = hs + p->kh < p->h + p->eh ? hs + p->kh : p->h + p->eh;
                    int we = ws + p->kw < p->w + p->ew ? ws + p->kw : p->w + p->ew;{count}
                    hs = hs < 0 ? 0 : hs;
                    ws = ws < 0 ? 0 : ws;
                    he = he > p->h ? p->h : he;
                    we = we > p->w ? p->w : we;{clipped}"""


def _pool_loops(body: str, decls: str, kind: str) -> str:
    return f"""
{{
    int b, c, oy, ox, iy, ix;
    for (b = 0; b < p->n; ++b) {{
        for (c = 0; c < p->c; ++c) {{
            const long plane = ((long)b * p->c + c);
            for (oy = 0; oy < p->oh; ++oy) {{
                for (ox = 0; ox < p->ow; ++ox) {{{decls}{_window(kind)}{body}
                }}
            }}
        }}
    }}
}}
"""


def maxpool(ks: KernelSet, x: CType, y: CType) -> str:
    """Max over the window, then the element copy of `_convert` (requantization is monotone)."""
    name = f"qcc_maxpool_{x.suffix}" + ("" if x.suffix == y.suffix else f"_{y.suffix}")
    acc = "float" if not x.is_int else "int32_t"
    store, helpers, extra = _convert(x, y, "m")
    params = ", ".join([f"const {x.name} *x", f"{y.name} *y", "const qcc_pool_t *p", *extra])
    body = f"""
                    m = x[plane * p->h * p->w + (long)hs * p->w + ws];
                    for (iy = hs; iy < he; ++iy) {{
                        for (ix = ws; ix < we; ++ix) {{
                            const {acc} v = x[plane * p->h * p->w + (long)iy * p->w + ix];
                            m = v > m ? v : m;
                        }}
                    }}
                    y[plane * p->oh * p->ow + (long)oy * p->ow + ox] = {store};"""
    decls = f"\n                    {acc} m;"
    return ks.kernel(name, lambda: f"\nstatic void {name}({params})" + _pool_loops(body, decls, "max"),
                     ("pool_t", *helpers))


def avgpool(ks: KernelSet, t: CType) -> str:
    name = f"qcc_avgpool_{t.suffix}"
    if t.is_int:
        sum_t = "int64_t"
        wide = 2 * t.bits
        lo, hi = -(1 << (wide - 1)), (1 << (wide - 1)) - 1
        wrap_sum = "s = qcc_wrap(s, 16);\n                    " if t.bits == 8 else ""
        store = (f"{wrap_sum}a = qcc_wrap(s / count, {t.bits});\n"
                 f"                    y[plane * p->oh * p->ow + (long)oy * p->ow + ox] = ({t.name})qcc_wrap(\n"
                 f"                        qcc_sat(qcc_shift(a, shift), ({lo + 1} - 1), {hi}), {t.bits});")
        decls = f"\n                    {sum_t} s = 0;\n                    long count;\n                    int32_t a;"
        params = f"const {t.name} *x, {t.name} *y, const qcc_pool_t *p, int shift"
        helpers: tuple[str, ...] = ("pool_t", "sat", "shift", "wrap")
    else:
        sum_t = "float"
        store = "y[plane * p->oh * p->ow + (long)oy * p->ow + ox] = s / (float)count;"
        decls = "\n                    float s = 0.0f;\n                    long count;"
        params = "const float *x, float *y, const qcc_pool_t *p"
        helpers = ("pool_t",)
    body = f"""
                    for (iy = hs; iy < he; ++iy) {{
                        for (ix = ws; ix < we; ++ix) {{
                            s += ({sum_t})x[plane * p->h * p->w + (long)iy * p->w + ix];
                        }}
                    }}
                    {store}"""
    return ks.kernel(name, lambda: f"\nstatic void {name}({params})" + _pool_loops(body, decls, "avg"), helpers)


UNARY: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    # op: (statements computing r from v, extra float parameters, helpers)
    "Relu": ("r = v > 0.0f ? v : 0.0f;", (), ()),
    "LeakyRelu": ("r = v > 0.0f ? v : v * alpha;", ("alpha",), ()),
    "Clip": ("r = v < lo ? lo : v;\n        r = r > hi ? hi : r;", ("lo", "hi"), ()),
    "Sigmoid": ("{\n            const float e = qcc_expf(-v);\n            const float d = 1.0f + e;\n"
                "            r = 1.0f / d;\n        }", (), ("expf",)),
    "Tanh": ("r = qcc_tanhf(v);", (), ("tanhf",)),
    "HardSigmoid": ("r = v * alpha;\n        r = r + beta;\n        r = r < 0.0f ? 0.0f : r;\n"
                    "        r = r > 1.0f ? 1.0f : r;", ("alpha", "beta"), ()),
    "HardSwish": ("r = v / 6.0f;\n        r = r + 0.5f;\n        r = r < 0.0f ? 0.0f : r;\n"
                  "        r = r > 1.0f ? 1.0f : r;\n        r = v * r;", (), ()),
    "Silu": ("r = v / (1.0f + qcc_expf(-v));", (), ("expf",)),
    "Elu": ("r = v > 0.0f ? v : alpha * (qcc_expf(v) - 1.0f);", ("alpha",), ("expf",)),
    "Exp": ("r = qcc_expf(v);", (), ("expf",)),
    "Abs": ("r = v < 0.0f ? -v : v;", (), ()),
    "Neg": ("r = -v;", (), ()),
    "Reciprocal": ("r = 1.0f / v;", (), ()),
    "Softplus": ("r = (v > 0.0f ? v : 0.0f) + (float)log1p((double)qcc_expf(v > 0.0f ? -v : v));", (), ("expf",)),
}


def unary(ks: KernelSet, op: str, x: CType, y: CType) -> str:
    stmts, extra, helpers = UNARY[op]
    name = f"qcc_{op.lower()}_{x.suffix}_{y.suffix}"
    params = [f"const {x.name} *x", f"{y.name} *y", "long n", *scale_params(x, y), *(f"float {e}" for e in extra)]
    deps = helpers + y.setter
    return ks.kernel(name, lambda: f"""
{_sig(name, params)}
{{
    long i;
    for (i = 0; i < n; ++i) {{
        const float v = {x.get("x[i]", "xinv")};
        float r;
        {stmts}
        y[i] = {y.set("r", "yscale")};
    }}
}}
""", deps)


def softmax(ks: KernelSet, x: CType, y: CType) -> str:
    """Peak, then exponentials and their float32 sum in index order, then each divided by the sum.

    Fixed point and float: nnabla-c-runtime's generic Softmax, which stores the exponentials in
    the output and reads them back. Affine (qcc.sim.affine_int): exp(v - peak) is recomputed for
    the division, so only the probabilities are quantized.
    """
    name = f"qcc_softmax_{x.suffix}_{y.suffix}"
    params = [f"const {x.name} *x", f"{y.name} *y", "long outer", "long axis", "long inner", *scale_params(x, y)]
    xv = x.get("x[base + k * inner]", "xinv")
    if y.affine is not None:
        total = f"total += qcc_expf({xv} - peak);"
        final = f"const float e = qcc_expf({xv} - peak);\n                y[base + k * inner] = {y.set('e / total', '')};"
    else:
        total = (f"const float e = qcc_expf({xv} - peak);\n                y[base + k * inner] = {y.set('e', 'yscale')};"
                 "\n                total = total + e;")
        final = (f"const float v = {y.get('y[base + k * inner]', '(1.0f / yscale)')} / total;"
                 f"\n                y[base + k * inner] = {y.set('v', 'yscale')};")
    return ks.kernel(name, lambda: f"""
{_sig(name, params)}
{{
    long o, i, k;
    for (o = 0; o < outer; ++o) {{
        for (i = 0; i < inner; ++i) {{
            const long base = o * axis * inner + i;
            float peak = {x.get("x[base]", "xinv")};
            float total = 0.0f;
            for (k = 0; k < axis; ++k) {{
                const float v = {xv};
                peak = v > peak ? v : peak;
            }}
            for (k = 0; k < axis; ++k) {{
                {total}
            }}
            for (k = 0; k < axis; ++k) {{
                {final}
            }}
        }}
    }}
}}
""", ("expf", *y.setter))


def batchnorm(ks: KernelSet, x: CType, y: CType) -> str:
    name = f"qcc_batchnorm_{x.suffix}_{y.suffix}"
    params = [f"const {x.name} *x", f"{y.name} *y", "const float *mean", "const float *gamma", "const float *beta",
              "const float *std", "long n", "long c", "long inner", *scale_params(x, y)]
    deps = y.setter
    return ks.kernel(name, lambda: f"""
/* ((x - mean) * gamma) / std + beta, one float32 operation at a time. */
{_sig(name, params)}
{{
    long b, ch, i;
    for (b = 0; b < n; ++b) {{
        for (ch = 0; ch < c; ++ch) {{
            const long base = (b * c + ch) * inner;
            for (i = 0; i < inner; ++i) {{
                float t = {x.get("x[base + i]", "xinv")} - mean[ch];
                t = t * gamma[ch];
                t = t / std[ch];
                t = t + beta[ch];
                y[base + i] = {y.set("t", "yscale")};
            }}
        }}
    }}
}}
""", deps)


def _convert(x: CType, y: CType, expr: str) -> tuple[str, tuple[str, ...], list[str]]:
    """Copying one element between types: (expression, helpers, kernel parameters it reads).

    Fixed point: requantization between positions (truncation, saturation); affine: requantization
    between scales and zero points (qcc.sim.affine_int); float: a plain copy.
    """
    if y.affine is not None:
        return (f"({y.name})qcc_requant((int64_t)({expr}) - zx, mult, shift, zy, {y.lo}, {y.hi})", ("requant",),
                ["int32_t zx", "int32_t mult", "int shift", "int32_t zy"])
    if x.is_int and y.is_int:
        return f"({y.name})qcc_sat(qcc_shift({expr}, shift), {y.lo}, {y.hi})", ("sat", "shift"), ["int shift"]
    return expr, (), []


def concat_part(ks: KernelSet, x: CType, y: CType) -> str:
    name = f"qcc_concat_{x.suffix}_{y.suffix}"
    value, helpers, extra = _convert(x, y, "x[j * inner + k]")
    params = [f"const {x.name} *x", f"{y.name} *y", "long outer", "long inner", "long total", "long offset", *extra]
    return ks.kernel(name, lambda: f"""
/* One input of a Concat: `outer` rows of `inner` elements into rows of `total` at `offset`. */
{_sig(name, params)}
{{
    long j, k;
    for (j = 0; j < outer; ++j) {{
        for (k = 0; k < inner; ++k) {{
            y[j * total + offset + k] = {value};
        }}
    }}
}}
""", helpers)


def transpose(ks: KernelSet, x: CType, y: CType) -> str:
    name = f"qcc_transpose_{x.suffix}_{y.suffix}"
    value, helpers, extra = _convert(x, y, "x[src]")
    params = [f"const {x.name} *x", f"{y.name} *y", "const qcc_perm_t *p", *extra]
    return ks.kernel(name, lambda: f"""
{_sig(name, params)}
{{
    long idx[QCC_MAX_RANK] = {{0}};
    long total = 1;
    long i, src = 0;
    int d;
    for (d = 0; d < p->rank; ++d) {{
        total *= p->shape[d];
    }}
    for (i = 0; i < total; ++i) {{
        y[i] = {value};
        for (d = p->rank - 1; d >= 0; --d) {{
            src += p->stride[d];
            if (++idx[d] < p->shape[d]) {{
                break;
            }}
            src -= p->stride[d] * p->shape[d];
            idx[d] = 0;
        }}
    }}
}}
""", ("perm", *helpers))


BINARY_F32 = {"Add": "av + bv", "Sub": "av - bv", "Mul": "av * bv", "Div": "av / bv",
              "Max": "av > bv ? av : bv", "Min": "av < bv ? av : bv"}


def binary(ks: KernelSet, op: str, t: CType) -> str:
    """Elementwise with broadcasting (p == NULL: same shapes). Fixed: Add/Sub/Mul (sim rules)."""
    name = f"qcc_{op.lower()}_{t.suffix}"
    if not t.is_int:
        expr = BINARY_F32[op]
        params = "const float *a, const float *b, float *y, long n, const qcc_bcast_t *p"
        prologue = ""
        helpers: tuple[str, ...] = ("bcast",)
    else:
        params = (f"const {t.name} *a, const {t.name} *b, {t.name} *y, long n, const qcc_bcast_t *p, "
                  "int sa_, int sb_, int shift")
        if op == "Mul":
            expr = f"({t.name})qcc_sat(qcc_shift((int64_t)av * bv, shift), {t.lo}, {t.hi})"
            prologue = "(void)sa_;\n    (void)sb_;\n    "
            helpers = ("bcast", "sat", "shift")
        else:
            fn = "qcc_sat_add" if op == "Add" else "qcc_sat_sub"
            expr = (f"({t.name})qcc_sat(qcc_shift({fn}((int32_t)qcc_shift(av, sa_), "
                    f"(int32_t)qcc_shift(bv, sb_), {t.bits}), shift), {t.lo}, {t.hi})")
            prologue = ""
            helpers = ("bcast", "sat", "shift", "sat_add" if op == "Add" else "sat_sub")
    ctype = t.name
    return ks.kernel(name, lambda: f"""
static void {name}({params})
{{
    long idx[QCC_MAX_RANK] = {{0}};
    long i, ia = 0, ib = 0;
    {prologue}if (p == NULL) {{
        for (i = 0; i < n; ++i) {{
            const {ctype} av = a[i];
            const {ctype} bv = b[i];
            y[i] = {expr};
        }}
        return;
    }}
    for (i = 0; i < n; ++i) {{
        const {ctype} av = a[ia];
        const {ctype} bv = b[ib];
        y[i] = {expr};
        qcc_bcast_next(p, idx, &ia, &ib);
    }}
}}
""", helpers)

