"""Reductions over consecutive axes, viewed as (outer, reduced, inner): float32 between the
mode's getter and setter (qcc.sim.f32.reduce: sums in index order), and the affine integer sum
and maximum (qcc.sim.affine_int.reduce_kernel)."""

from __future__ import annotations

from qcc.backends.c.ctype import CType, scale_params
from qcc.backends.c.kernels.helpers import KernelSet, signature

_FLOAT = {
    # op: (start value, accumulate v into s, finish s)
    "ReduceSum": ("0.0f", "s = s + v;", ""),
    "ReduceMean": ("0.0f", "s = s + v;", "s = s / (float)red;"),
    "ReduceMax": ("FIRST", "s = v > s ? v : s;", ""),
    "ReduceL2": ("0.0f", "v = v * v;\n                s = s + v;", "s = sqrtf(s);"),
}


def reduce_f32(ks: KernelSet, op: str, x: CType, y: CType) -> str:
    name = f"qcc_{op.lower()}_{x.suffix}_{y.suffix}"
    start, step, finish = _FLOAT[op]
    get = x.get("x[(o * red + r) * inner + i]", "xinv")
    first = x.get("x[o * red * inner + i]", "xinv")
    if op == "ReduceL2":
        ks.uses_math = True
    params = [f"const {x.name} *x", f"{y.name} *y", "long outer", "long red", "long inner", *scale_params(x, y)]
    return ks.kernel(name, lambda: f"""
{signature(name, params)}
{{
    long o, r, i;
    for (o = 0; o < outer; ++o) {{
        for (i = 0; i < inner; ++i) {{
            float s = {first if start == "FIRST" else start};
            for (r = 0; r < red; ++r) {{
                float v = {get};
                {step}
            }}
            {finish}
            y[o * inner + i] = {y.set("s", "yscale")};
        }}
    }}
}}
""", y.setter)


def reduce_affine(ks: KernelSet, op: str, x: CType, y: CType) -> str:
    """ReduceMax: the largest stored value; ReduceSum/ReduceMean: the sum of (q - zx); then requantize."""
    name = f"qcc_{op.lower()}_{x.suffix}_{y.suffix}"
    is_max = op == "ReduceMax"
    start = "(int64_t)x[o * red * inner + i]" if is_max else "0"
    step = "s = v > s ? v : s;" if is_max else "s += v - zx;"
    result = "s - zx" if is_max else "s"
    params = [f"const {x.name} *x", f"{y.name} *y", "long outer", "long red", "long inner", "int32_t zx",
              "int32_t mult", "int shift", "int32_t zy"]
    return ks.kernel(name, lambda: f"""
{signature(name, params)}
{{
    long o, r, i;
    for (o = 0; o < outer; ++o) {{
        for (i = 0; i < inner; ++i) {{
            int64_t s = {start};
            for (r = 0; r < red; ++r) {{
                const int64_t v = x[(o * red + r) * inner + i];
                {step}
            }}
            y[o * inner + i] = ({y.name})qcc_requant({result}, mult, shift, zy, {y.lo}, {y.hi});
        }}
    }}
}}
""", ("requant",))
