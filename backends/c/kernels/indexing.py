"""ArgMax and TopK along one axis, viewed as (outer, axis, inner), on stored values (integer
storage orders like the values it stands for); ties go to the lower index (the first maximum;
ArgMax's select_last_index the last)."""

from __future__ import annotations

from qcc.backends.c.ctype import CType
from qcc.backends.c.kernels.helpers import KernelSet, signature
from qcc.backends.c.kernels.movement import convert


def argmax(ks: KernelSet, x: CType) -> str:
    name = f"qcc_argmax_{x.suffix}"
    element = "float" if not x.is_int else "int32_t"
    params = [f"const {x.name} *x", "int32_t *y", "long outer", "long axis", "long inner", "int last"]
    return ks.kernel(name, lambda: f"""
{signature(name, params)}
{{
    long o, i, k;
    for (o = 0; o < outer; ++o) {{
        for (i = 0; i < inner; ++i) {{
            const {x.name} *row = x + o * axis * inner + i;
            {element} best = row[0];
            int32_t at = 0;
            for (k = 1; k < axis; ++k) {{
                const {element} v = row[k * inner];
                if (v > best || (last && v == best)) {{
                    best = v;
                    at = (int32_t)k;
                }}
            }}
            y[o * inner + i] = at;
        }}
    }}
}}
""")


def topk(ks: KernelSet, x: CType, y: CType) -> str:
    """k rounds of selection: the best element not taken yet, the lowest index among equals."""
    name = f"qcc_topk_{x.suffix}_{y.suffix}"
    element = "float" if not x.is_int else "int32_t"
    value, helpers, extra = convert(x, y, "row[best * inner]")
    params = [f"const {x.name} *x", f"{y.name} *values", "int32_t *indices", "long outer", "long axis", "long inner",
              "long k", "int largest", *extra]
    return ks.kernel(name, lambda: f"""
{signature(name, params)}
{{
    long o, i, t, j, u;
    for (o = 0; o < outer; ++o) {{
        for (i = 0; i < inner; ++i) {{
            const {x.name} *row = x + o * axis * inner + i;
            const long base = o * k * inner + i;
            for (t = 0; t < k; ++t) {{
                long best = -1;
                for (j = 0; j < axis; ++j) {{
                    int taken = 0;
                    for (u = 0; u < t; ++u) {{
                        taken |= indices[base + u * inner] == (int32_t)j;
                    }}
                    if (!taken) {{
                        const {element} v = row[j * inner];
                        if (best < 0 || (largest ? v > ({element})row[best * inner] : v < ({element})row[best * inner])) {{
                            best = j;
                        }}
                    }}
                }}
                indices[base + t * inner] = (int32_t)best;
                values[base + t * inner] = {value};
            }}
        }}
    }}
}}
""", helpers)
