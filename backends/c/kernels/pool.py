"""Pooling kernels (max, average, global) in every numeric mode.

Separable: per output row, the window's input rows are reduced column by column into a padded row
buffer (fixed-length passes along the row), then each output reduces kw consecutive (strided)
buffer entries, so no input element is read once per window it belongs to. Maps wider than the
buffer (QCC_POOLW) take the window-by-window walk. Input, output and geometry are `restrict` (a
pooling step never runs in place): an 8-bit output would otherwise alias every other pointer and
force reloads of the geometry after each store. Max pads with the type's lowest value, which a
window that holds any input element never returns; averages pad with 0 and count the elements as
the window walk does (padding counted with count_include_pad)."""

from __future__ import annotations

from qcc.backends.c.ctype import CType
from qcc.backends.c.kernels.helpers import KernelSet
from qcc.backends.c.kernels.movement import convert


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


def separable(x: CType, acc: str, init: str, combine: str, finish: str, kind: str, load: str = "xr[ix]") -> str:
    """The row-buffer walk: `combine` folds `v` into `slot` (columns, where `load` reads the input,
    then windows); `finish` stores y from `r` (and `count` for averages)."""
    counts = """
                const int rows = p->include_pad ? (hs + p->kh < p->h + p->eh ? p->kh : p->h + p->eh - hs)
                                                : (he < p->h ? he : p->h) - (hs < 0 ? 0 : hs);""" if kind == "avg" else ""
    colcount = """
                    const int ws = ox * p->sw - p->pw;
                    const int we = ws + p->kw < p->w + p->ew ? ws + p->kw : p->w + p->ew;
                    const long count = (long)rows * (p->include_pad ? we - ws
                                                     : (we < p->w ? we : p->w) - (ws < 0 ? 0 : ws));""" \
        if kind == "avg" else ""
    return f"""    if (span <= QCC_POOLW && p->ow <= QCC_POOLW) {{
        {acc} col[QCC_POOLW];
        {acc} win[QCC_POOLW];
        const int lim = p->w < span - p->pw ? p->w : span - p->pw;
        for (b = 0; b < p->n; ++b) {{
            for (c = 0; c < p->c; ++c) {{
                const long plane = ((long)b * p->c + c);
                for (oy = 0; oy < p->oh; ++oy) {{
                    const int hs = oy * p->sh - p->ph;
                    const int he = hs + p->kh < p->h + p->eh ? hs + p->kh : p->h + p->eh;{counts}
                    for (ix = 0; ix < span; ++ix) {{
                        col[ix] = {init};
                    }}
                    for (iy = hs < 0 ? 0 : hs; iy < (he < p->h ? he : p->h); ++iy) {{
                        const {x.name} *restrict xr = x + (plane * p->h + iy) * p->w;
                        for (ix = 0; ix < lim; ++ix) {{
                            const {acc} v = {load};
                            {acc} *restrict slot = &col[ix + p->pw];
                            {combine}
                        }}
                    }}
                    for (ox = 0; ox < p->ow; ++ox) {{
                        win[ox] = col[ox * p->sw];
                    }}
                    for (t = 1; t < p->kw; ++t) {{
                        for (ox = 0; ox < p->ow; ++ox) {{
                            const {acc} v = col[ox * p->sw + t];
                            {acc} *restrict slot = &win[ox];
                            {combine}
                        }}
                    }}
                    for (ox = 0; ox < p->ow; ++ox) {{{colcount}
                        const {acc} r = win[ox];
                        {finish}
                    }}
                }}
            }}
        }}
        return;
    }}
"""


def pool_loops(body: str, decls: str, kind: str, fast: str = "") -> str:
    return f"""
{{
    const int span = (p->ow - 1) * p->sw + p->kw;
    int b, c, oy, ox, iy, ix, t;
    (void)t;
{fast}
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


def maxpool(ks: KernelSet, x: CType, y: CType, same: bool = False) -> str:
    """Max over the window, then the element copy of `_convert` (requantization is monotone).
    `same`: the output stores the input's values as they are (the affine requantization between
    them is the identity): a max of stored values in their own type, no conversion."""
    name = f"qcc_maxpool_{x.suffix}" + ("_same" if same else "" if x.suffix == y.suffix else f"_{y.suffix}")
    acc = x.name if same else "float" if not x.is_int else "int32_t"
    store, helpers, extra = ("m", (), []) if same else convert(x, y, "m")
    params = ", ".join([f"const {x.name} *restrict x", f"{y.name} *restrict y", "const qcc_pool_t *restrict p", *extra])
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
    lowest = str(x.lo) if x.is_int else "-HUGE_VALF"
    ks.uses_math |= not x.is_int
    fast = separable(x, acc, lowest, "*slot = v > *slot ? v : *slot;",
                     f"const {acc} m = r;\n                        y[(plane * p->oh + oy) * p->ow + ox] = {store};",
                     "max")
    return ks.kernel(name, lambda: f"\nstatic void {name}({params})" + pool_loops(body, decls, "max", fast),
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
        finish = (f"int64_t s = r;\n                        int32_t a;\n                        {wrap_sum}"
                  f"a = qcc_wrap(s / count, {t.bits});\n"
                  f"                        y[(plane * p->oh + oy) * p->ow + ox] = ({t.name})qcc_wrap(\n"
                  f"                            qcc_sat(qcc_shift(a, shift), ({lo + 1} - 1), {hi}), {t.bits});")
        decls = f"\n                    {sum_t} s = 0;\n                    long count;\n                    int32_t a;"
        params = f"const {t.name} *restrict x, {t.name} *restrict y, const qcc_pool_t *restrict p, int shift"
        helpers: tuple[str, ...] = ("pool_t", "sat", "shift", "wrap")
    else:
        sum_t = "float"
        store = "y[plane * p->oh * p->ow + (long)oy * p->ow + ox] = s / (float)count;"
        finish = "y[(plane * p->oh + oy) * p->ow + ox] = r / (float)count;"
        decls = "\n                    float s = 0.0f;\n                    long count;"
        params = "const float *restrict x, float *restrict y, const qcc_pool_t *restrict p"
        helpers = ("pool_t",)
    body = f"""
                    for (iy = hs; iy < he; ++iy) {{
                        for (ix = ws; ix < we; ++ix) {{
                            s += ({sum_t})x[plane * p->h * p->w + (long)iy * p->w + ix];
                        }}
                    }}
                    {store}"""
    fast = separable(t, sum_t, "0", "*slot += v;", finish, "avg")
    return ks.kernel(name, lambda: f"\nstatic void {name}({params})" + pool_loops(body, decls, "avg", fast), helpers)


def avgpool_affine(ks: KernelSet, x: CType, y: CType) -> str:
    name = f"qcc_avgpool_{x.suffix}_{y.suffix}"
    body = f"""
                    for (iy = hs; iy < he; ++iy) {{
                        for (ix = ws; ix < we; ++ix) {{
                            s += (int32_t)x[plane * p->h * p->w + (long)iy * p->w + ix] - zx;
                        }}
                    }}
                    y[plane * p->oh * p->ow + (long)oy * p->ow + ox] =
                        ({y.name})qcc_requant(s, mult[count], shift[count], zy, {y.lo}, {y.hi});"""
    params = (f"const {x.name} *restrict x, {y.name} *restrict y, const qcc_pool_t *restrict p, int32_t zx, "
              "const int32_t *restrict mult, const int32_t *restrict shift, int32_t zy")
    decls = "\n                    int32_t s = 0;\n                    long count;"
    fast = separable(x, "int32_t", "0", "*slot += v;",
                     f"y[(plane * p->oh + oy) * p->ow + ox] = ({y.name})qcc_requant(r, mult[count], shift[count], "
                     f"zy, {y.lo}, {y.hi});", "avg", load="(int32_t)xr[ix] - zx")
    return ks.kernel(name, lambda: f"""
/* The sum of (x - zx) over the window, requantized by the multiplier of its element count. */
static void {name}({params})""" + pool_loops(body, decls, "avg", fast), ("pool_t", "requant"))
