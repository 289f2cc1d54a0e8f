"""Data movement: requantizing copies (views, Quantize), Concat, Transpose, and the quantization
of the graph's inputs and dequantization of its outputs."""

from __future__ import annotations

from qcc.backends.c.ctype import CType
from qcc.backends.c.kernels.helpers import KernelSet, signature


def convert(x: CType, y: CType, expr: str) -> tuple[str, tuple[str, ...], list[str]]:
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
    value, helpers, extra = convert(x, y, "x[j * inner + k]")
    params = [f"const {x.name} *x", f"{y.name} *y", "long outer", "long inner", "long total", "long offset", *extra]
    return ks.kernel(name, lambda: f"""
/* One input of a Concat: `outer` rows of `inner` elements into rows of `total` at `offset`. */
{signature(name, params)}
{{
    long j, k;
    for (j = 0; j < outer; ++j) {{
        for (k = 0; k < inner; ++k) {{
            y[j * total + offset + k] = {value};
        }}
    }}
}}
""", helpers)


def _walk(ks: KernelSet, name: str, x: CType, y: CType, start: bool) -> str:
    """y in order, read from x at the output index times the per-axis input strides of p (plus
    `start`, an element offset, when asked): Transpose, Slice, the parts of a Split. The last axis
    is a loop of its own, contiguous where its stride is 1 (params.walk_fields merges the axes)."""
    value, helpers, extra = convert(x, y, "x[src]")
    run, _, _ = convert(x, y, "xs[k]")
    strided, _, _ = convert(x, y, "xs[k * step]")
    params = [f"const {x.name} *x", f"{y.name} *y", "const qcc_perm_t *p", *(["long start"] if start else []), *extra]
    return ks.kernel(name, lambda: f"""
{signature(name, params)}
{{
    long idx[QCC_MAX_RANK] = {{0}};
    long total = 1;
    long i, k, src = {"start" if start else "0"};
    int d;
    const int last = p->rank - 1;
    long inner, step;
    if (last < 0) {{
        y[0] = {value};
        return;
    }}
    for (d = 0; d < p->rank; ++d) {{
        total *= p->shape[d];
    }}
    inner = p->shape[last];
    step = p->stride[last];
    for (i = 0; i < total; i += inner) {{
        const {x.name} *xs = x + src;
        {y.name} *yi = y + i;
        if (step == 1) {{
            for (k = 0; k < inner; ++k) {{
                yi[k] = {run};
            }}
        }} else {{
            for (k = 0; k < inner; ++k) {{
                yi[k] = {strided};
            }}
        }}
        for (d = last - 1; d >= 0; --d) {{
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


def transpose(ks: KernelSet, x: CType, y: CType) -> str:
    return _walk(ks, f"qcc_transpose_{x.suffix}_{y.suffix}", x, y, start=False)


def pad(ks: KernelSet, x: CType, y: CType) -> str:
    """Pad in every mode: y in order; along output axis d, map[offset of d + index] is the source
    index along d, or -1 where the element is the fill (constant mode; reflect and edge maps
    never hold -1). The fill is already in y's storage type."""
    name = f"qcc_pad_{x.suffix}_{y.suffix}"
    value, helpers, extra = convert(x, y, "x[src]")
    params = [f"const {x.name} *x", f"{y.name} *y", "const qcc_perm_t *p", "const int32_t *map", f"{y.name} fill",
              *extra]
    return ks.kernel(name, lambda: f"""
{signature(name, params)}
{{
    long idx[QCC_MAX_RANK] = {{0}};
    long total = 1;
    long i;
    int d;
    for (d = 0; d < p->rank; ++d) {{
        total *= p->shape[d];
    }}
    for (i = 0; i < total; ++i) {{
        long src = 0, offset = 0;
        int inside = 1;
        for (d = 0; d < p->rank; ++d) {{
            const int32_t s = map[offset + idx[d]];
            offset += p->shape[d];
            if (s < 0) {{
                inside = 0;
                break;
            }}
            src += (long)s * p->stride[d];
        }}
        y[i] = inside ? {value} : fill;
        for (d = p->rank - 1; d >= 0; --d) {{
            if (++idx[d] < p->shape[d]) {{
                break;
            }}
            idx[d] = 0;
        }}
    }}
}}
""", ("perm", *helpers))


def strided(ks: KernelSet, x: CType, y: CType) -> str:
    """From element `start` of x with per-axis strides that may be negative (Slice, a Split part)."""
    return _walk(ks, f"qcc_strided_{x.suffix}_{y.suffix}", x, y, start=True)


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
    value, helpers, extra = convert(x, y, "x[i]")
    params = [f"const {x.name} *x", f"{y.name} *y", "long n", *extra]
    return ks.kernel(name, lambda: f"""
{signature(name, params)}
{{
    long i;
    for (i = 0; i < n; ++i) {{
        y[i] = {value};
    }}
}}
""", helpers)


def quantize_input_affine(ks: KernelSet, y: CType) -> str:
    name = f"qcc_quantize_{y.suffix}"
    return ks.kernel(name, lambda: f"""
static void {name}(const float *x, {y.name} *q, long n, float scale, int32_t zp)
{{
    long i;
    for (i = 0; i < n; ++i) {{
        q[i] = ({y.name})qcc_quantize(x[i], scale, zp, {y.lo}, {y.hi});
    }}
}}
""", ("quantize",))


def dequantize_affine(ks: KernelSet, x: CType) -> str:
    name = f"qcc_dequantize_{x.suffix}"
    return ks.kernel(name, lambda: f"""
static void {name}(const {x.name} *q, float *y, long n, float scale, int32_t zp)
{{
    long i;
    for (i = 0; i < n; ++i) {{
        y[i] = (float)((int32_t)q[i] - zp) * scale;
    }}
}}
""")


def indices_out(ks: KernelSet) -> str:
    """Element indices (ArgMax, TopK) leave the arena as float values (exact below 2**24)."""
    return ks.kernel("qcc_indices_out", lambda: """
static void qcc_indices_out(const int32_t *q, float *y, long n)
{
    long i;
    for (i = 0; i < n; ++i) {
        y[i] = (float)q[i];
    }
}
""")


def gather(ks: KernelSet, x: CType, y: CType) -> str:
    """y[o][t][i] = x[o][index[t]][i]: constant indices along one axis (Gather, nearest Resize rows)."""
    name = f"qcc_gather_{x.suffix}_{y.suffix}"
    value, helpers, extra = convert(x, y, "x[(o * axis + index[t]) * inner + i]")
    params = [f"const {x.name} *x", f"{y.name} *y", "long outer", "long axis", "long inner", "long count",
              "const int32_t *index", *extra]
    return ks.kernel(name, lambda: f"""
{signature(name, params)}
{{
    long o, t, i;
    for (o = 0; o < outer; ++o) {{
        for (t = 0; t < count; ++t) {{
            for (i = 0; i < inner; ++i) {{
                y[(o * count + t) * inner + i] = {value};
            }}
        }}
    }}
}}
""", helpers)

