"""Convolution and Dense kernels in every numeric mode.

Float: accumulate every tap. Fixed point (`qcc.sim.fixed`): int64 sums (int32 for 8x8 bits)
truncated toward zero by C division semantics, saturated, the runtime's saturating bias add.
Affine (`qcc.sim.affine_int`): int32 sums of (x - zx) * w started at the bias, requantized per
output channel. Float code writes one operation per statement where a multiply meets an add
(no FMA contraction under the default C99 rules).
"""

from __future__ import annotations

from qcc.backends.c.ctype import FLOAT, CType
from qcc.backends.c.kernels.helpers import KernelSet, signature


def conv_f32(ks: KernelSet) -> str:
    return ks.kernel("qcc_conv_f32", lambda: conv_source("qcc_conv_f32", FLOAT, FLOAT, FLOAT),
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


def conv_fixed(ks: KernelSet, x: CType, w: CType, y: CType, pointwise: bool = False) -> str:
    """`pointwise` (1x1 kernels): one product per channel fits int32 even at 16 bits."""
    name = f"qcc_conv{'1x1' if pointwise else ''}_{x.suffix}_{w.suffix}_{y.suffix}"
    return ks.kernel(name, lambda: conv_source(name, x, w, y, pointwise), ("conv_t", "sat_add"))


def conv_source(name: str, x: CType, w: CType, y: CType, pointwise: bool = False) -> str:
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


def conv_affine(ks: KernelSet, x: CType, w: CType, y: CType) -> str:
    """The float/fixed kernel's loops (row chunks, 4 output channels at once) on (x - zx) * w with
    int32 sums; padding reads as zx (the real zero); the bias starts the sum; requant per channel."""
    name = f"qcc_conv_{x.suffix}_{w.suffix}_{y.suffix}"
    return ks.kernel(name, lambda: conv_source(name, x, w, y), ("conv_t", "requant"))


def dense_affine(ks: KernelSet, x: CType, w: CType, y: CType) -> str:
    name = f"qcc_dense_{x.suffix}_{w.suffix}_{y.suffix}"
    params = [f"const {x.name} *x", f"const {w.name} *w", "const int32_t *bias", f"{y.name} *y", "long n", "long k",
              "long m", "int32_t zx", "const int32_t *mult", "const int32_t *shift", "int32_t zy"]
    return ks.kernel(name, lambda: f"""
/* y = requant(bias + (x - zx) (n, k) @ w^T, w (m, k) centered), per output column. */
{signature(name, params)}
{{
    long i, j, t;
    for (i = 0; i < n; ++i) {{
        const {x.name} *xi = x + i * k;
        for (j = 0; j < m; ++j) {{
            const {w.name} *wj = w + j * k;
            int32_t acc = bias[j];
            for (t = 0; t < k; ++t) {{
                acc += ((int32_t)xi[t] - zx) * (int32_t)wj[t];
            }}
            y[i * m + j] = ({y.name})qcc_requant(acc, mult[j], shift[j], zy, {y.lo}, {y.hi});
        }}
    }}
}}
""", ("requant",))
