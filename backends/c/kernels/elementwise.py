"""Elementwise kernels: one-input activations, broadcasting binary ops, affine lookup tables.

Float and fixed point share the one-input kernels (fixed point reads through the runtime's getter,
computes in float32 one operation at a time, stores through its setter); the fixed-point Relu and
Add/Sub/Mul are integer kernels (`qcc.sim.fixed`); affine one-input ops are tables and affine
binary ops requantize in int64 (`qcc.sim.affine_int`).
"""

from __future__ import annotations

import numpy as np
from qcc.backends.c.ctype import CType, scale_params
from qcc.backends.c.kernels.helpers import KernelSet, signature


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
    "HardSwish": ("r = v * 0x1.555556p-3f;\n        r = r + 0.5f;\n        r = r < 0.0f ? 0.0f : r;\n"
                  "        r = r > 1.0f ? 1.0f : r;\n        r = v * r;", (), ()),
    "Silu": ("r = v / (1.0f + qcc_expf(-v));", (), ("expf",)),
    "Elu": ("r = v > 0.0f ? v : alpha * (qcc_expf(v) - 1.0f);", ("alpha",), ("expf",)),
    "Exp": ("r = qcc_expf(v);", (), ("expf",)),
    "Abs": ("r = v < 0.0f ? -v : v;", (), ()),
    "Neg": ("r = -v;", (), ()),
    "Reciprocal": ("r = 1.0f / v;", (), ()),
    "Softplus": ("r = (v > 0.0f ? v : 0.0f) + (float)log1p((double)qcc_expf(v > 0.0f ? -v : v));", (), ("expf",)),
    "Erf": ("r = (float)erf((double)v);", (), ("libm",)),
    "Log": ("r = (float)log((double)v);", (), ("libm",)),
    "Sqrt": ("r = (float)sqrt((double)v);", (), ("libm",)),
    "Gelu": ("if (form > 0.5f) {\n            float t = v * v;\n            t = t * v;\n            t = t * 0.044715f;\n"
             "            t = v + t;\n            t = t * 0.797884561f;\n            t = qcc_tanhf(t);\n"
             "            t = t + 1.0f;\n            t = t * 0.5f;\n            r = v * t;\n        } else {\n"
             "            float t = v * 0.707106781f;\n            t = (float)erf((double)t);\n            t = t + 1.0f;\n"
             "            t = t * 0.5f;\n            r = v * t;\n        }", ("form",), ("tanhf", "libm")),
    "Mish": ("r = v * qcc_tanhf((v > 0.0f ? v : 0.0f) + (float)log1p((double)qcc_expf(v > 0.0f ? -v : v)));", (),
             ("expf", "tanhf")),
}


def unary(ks: KernelSet, op: str, x: CType, y: CType) -> str:
    stmts, extra, helpers = UNARY[op]
    name = f"qcc_{op.lower()}_{x.suffix}_{y.suffix}"
    params = [f"const {x.name} *x", f"{y.name} *y", "long n", *scale_params(x, y), *(f"float {e}" for e in extra)]
    deps = helpers + y.setter
    return ks.kernel(name, lambda: f"""
{signature(name, params)}
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


BINARY_F32 = {"Add": "av + bv", "Sub": "av - bv", "Mul": "av * bv", "Div": "av / bv",
              "Max": "av > bv ? av : bv", "Min": "av < bv ? av : bv", "PRelu": "av < 0.0f ? av * bv : av",
              "Pow": "(float)pow((double)av, (double)bv)"}


def binary(ks: KernelSet, op: str, t: CType) -> str:
    """Elementwise with broadcasting (p == NULL: same shapes). Fixed: Add/Sub/Mul (sim rules)."""
    name = f"qcc_{op.lower()}_{t.suffix}"
    if not t.is_int:
        expr = BINARY_F32[op]
        params = "const float *a, const float *b, float *y, long n, const qcc_bcast_t *p"
        prologue = ""
        helpers: tuple[str, ...] = ("bcast", "libm") if op == "Pow" else ("bcast",)
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
    return ks.kernel(name, lambda: _broadcasting(name, params, t.name, expr, prologue), helpers)


def indent(body: str, spaces: int) -> str:
    """Statements (lines without their indentation) for a line `spaces` deep, ending where the next one starts."""
    return "".join(line.strip() + "\n" + " " * spaces for line in body.splitlines() if line.strip())


def _broadcasting(name: str, params: str, element: str, expr: str, prologue: str = "", body: str = "") -> str:
    """A binary kernel's loops: same shapes when p == NULL, else rows along the last (merged,
    params.bcast_params) axis, each a loop of its own where an input is contiguous (stride 1) or one
    value (stride 0): a per-channel PRelu slope or a scalar operand vectorizes. `body`: statements
    between reading av, bv and storing `expr`."""
    def row(sa: str, sb: str) -> str:
        return f"""for (k = 0; k < inner; ++k) {{
                const {element} av = a[ia + {sa}];
                const {element} bv = b[ib + {sb}];
                {indent(body, 16)}y[i + k] = {expr};
            }}"""
    return f"""
static void {name}({params})
{{
    long idx[QCC_MAX_RANK] = {{0}};
    long i, k, ia = 0, ib = 0;
    long inner, la, lb;
    int d, last;
    {prologue}if (p == NULL) {{
        for (i = 0; i < n; ++i) {{
            const {element} av = a[i];
            const {element} bv = b[i];
            {indent(body, 12)}y[i] = {expr};
        }}
        return;
    }}
    last = p->rank - 1;
    inner = p->shape[last];
    la = p->sa[last];
    lb = p->sb[last];
    for (i = 0; i < n; i += inner) {{
        if (la == 1 && lb == 1) {{
            {row("k", "k")}
        }} else if (la == 1 && lb == 0) {{
            {row("k", "0")}
        }} else if (la == 0 && lb == 1) {{
            {row("0", "k")}
        }} else {{
            {row("k * la", "k * lb")}
        }}
        for (d = last - 1; d >= 0; --d) {{
            ia += p->sa[d];
            ib += p->sb[d];
            if (++idx[d] < p->shape[d]) {{
                break;
            }}
            ia -= p->sa[d] * p->shape[d];
            ib -= p->sb[d] * p->shape[d];
            idx[d] = 0;
        }}
    }}
}}
"""


def table(ks: KernelSet, x: CType, y: CType) -> str:
    name = f"qcc_table_{x.suffix}_{y.suffix}"
    return ks.kernel(name, lambda: f"""
/* One-input elementwise op as a lookup: t[x - lo] (the table is computed by qcc). */
static void {name}(const {x.name} *x, {y.name} *y, long n, const {y.name} *t)
{{
    long i;
    for (i = 0; i < n; ++i) {{
        y[i] = t[(int32_t)x[i] - ({x.lo})];
    }}
}}
""")


def clamp(ks: KernelSet, x: CType) -> str:
    """A lookup table that is a clamp of the stored value (an affine Relu, Clip, or the identity:
    `table_clamp`): max and min, which vectorize where the table's gather does not. In place allowed."""
    name = f"qcc_clamp_{x.suffix}"
    return ks.kernel(name, lambda: f"""
/* y = x clamped to [lo, hi] (a lookup table that is a clamp). */
static void {name}(const {x.name} *x, {x.name} *y, long n, int32_t lo, int32_t hi)
{{
    long i;
    for (i = 0; i < n; ++i) {{
        const int32_t v = x[i];
        y[i] = ({x.name})(v < lo ? lo : (v > hi ? hi : v));
    }}
}}
""")


def table_clamp(table: np.ndarray, x: CType, y: CType) -> tuple[int, int] | None:
    """(lo, hi) when the lookup table of x's stored values is the clamp of the value itself to
    [lo, hi] and y stores the same type, else None."""
    if x.name != y.name:
        return None
    values = np.arange(x.lo, x.hi + 1)
    lo, hi = int(np.min(table)), int(np.max(table))
    return (lo, hi) if np.array_equal(np.asarray(table), np.clip(values, lo, hi)) else None


AFFINE_BINARY = {
    # op: (extra parameters, element expression from av, bv)
    "Add": ("int32_t za, int32_t zb, int64_t ma, int64_t mb, int shift, int32_t zy",
            "qcc_requant(((int64_t)av - za) * ma + ((int64_t)bv - zb) * mb, 1, shift, zy, LO, HI)"),
    "Sub": ("int32_t za, int32_t zb, int64_t ma, int64_t mb, int shift, int32_t zy",
            "qcc_requant(((int64_t)av - za) * ma - ((int64_t)bv - zb) * mb, 1, shift, zy, LO, HI)"),
    "Mul": ("int32_t za, int32_t zb, int64_t mult, int shift, int32_t zy",
            "qcc_requant(((int64_t)av - za) * ((int64_t)bv - zb), mult, shift, zy, LO, HI)"),
    "Max": ("int32_t za, int64_t ma, int sa, int32_t zb, int64_t mb, int sb, int32_t zy",
            "qcc_max(qcc_requant((int64_t)av - za, ma, sa, zy, LO, HI), qcc_requant((int64_t)bv - zb, mb, sb, zy, LO, HI))"),
    "Min": ("int32_t za, int64_t ma, int sa, int32_t zb, int64_t mb, int sb, int32_t zy",
            "qcc_min(qcc_requant((int64_t)av - za, ma, sa, zy, LO, HI), qcc_requant((int64_t)bv - zb, mb, sb, zy, LO, HI))"),
}


def binary_affine(ks: KernelSet, op: str, a: CType, b: CType, y: CType) -> str:
    """Elementwise with broadcasting (p == NULL: same shapes); see AFFINE_BINARY for the arithmetic."""
    name = f"qcc_{op.lower()}_{a.suffix}_{b.suffix}_{y.suffix}"
    extra, expr = AFFINE_BINARY[op]
    expr = f"({y.name}){expr.replace('LO', str(y.lo)).replace('HI', str(y.hi))}"
    helpers = ("bcast", "requant") + (("minmax",) if op in ("Max", "Min") else ())
    params = f"const {a.name} *a, const {b.name} *b, {y.name} *y, long n, const qcc_bcast_t *p, {extra}"
    return ks.kernel(name, lambda: _broadcasting(name, params, "int32_t", expr), helpers)


def prelu_affine(ks: KernelSet, x: CType, y: CType) -> str:
    """qcc.sim.affine_int.prelu_kernel: the slope element of x[i] is found by walking the
    broadcast (p is never NULL); mn/sn are per slope element, signed multipliers."""
    name = f"qcc_prelu_{x.suffix}_{y.suffix}"
    params = (f"const {x.name} *x, {y.name} *y, long n, const qcc_bcast_t *p, const int32_t *mn, const int32_t *sn, "
              "int32_t zx, int32_t mp, int sp, int32_t zy")
    return ks.kernel(name, lambda: f"""
static void {name}({params})
{{
    long idx[QCC_MAX_RANK] = {{0}};
    long i, ia = 0, ib = 0;
    for (i = 0; i < n; ++i) {{
        const int64_t c = (int64_t)x[i] - zx;
        y[i] = ({y.name})(c < 0 ? qcc_requant(c, mn[ib], sn[ib], zy, {y.lo}, {y.hi})
                                : qcc_requant(c, mp, sp, zy, {y.lo}, {y.hi}));
        qcc_bcast_next(p, idx, &ia, &ib);
    }}
}}
""", ("bcast", "bcast_next", "requant"))


def prelu_generic(ks: KernelSet, x: CType, y: CType) -> str:
    """Fixed point (the runtime's generic PReLU): v = getter(x); v < 0 ? v * slope : v; setter.
    The slopes are float32 per slope element, walked by the broadcast (p is never NULL)."""
    name = f"qcc_prelu_{x.suffix}_{y.suffix}"
    params = [f"const {x.name} *x", f"{y.name} *y", "long n", "const qcc_bcast_t *p", "const float *slope",
              *scale_params(x, y)]
    return ks.kernel(name, lambda: f"""
{signature(name, params)}
{{
    long idx[QCC_MAX_RANK] = {{0}};
    long i, ia = 0, ib = 0;
    for (i = 0; i < n; ++i) {{
        const float v = {x.get("x[i]", "xinv")};
        const float r = v < 0.0f ? v * slope[ib] : v;
        y[i] = {y.set("r", "yscale")};
        qcc_bcast_next(p, idx, &ia, &ib);
    }}
}}
""", ("bcast", "bcast_next", *y.setter))
