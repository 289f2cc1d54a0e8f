"""The affine Add/Sub's requantization in 32-bit unsigned arithmetic, where that is exact.

`qcc.sim.affine_int.add_kernel` computes `y = sat(zy + rshift(ca * ma +- cb * mb, s))` (centered
8-bit inputs, 31-bit multipliers, rounding half away from zero): a 64-bit product per operand,
which vectorizes poorly (no 64 x 64 multiply below AVX-512DQ, and half the lanes where there is
one). The same integer comes out of 32-bit operations after three exact rewrites:

- offsets: `ua = qa - lo_a` and `ub = qb - lo_b` (Sub: `hi_b - qb`) are in [0, 255], so
  `t = ua * ma + ub * mb - Z` with the constant Z (the zero points' share);
- rounding half away as a floor: `rshift(t, s) = floor((t + h - [t < 0]) / 2^s)`, `h = 2^(s-1)`,
  and a constant `B * 2^s` added to make the dividend nonnegative (`C = h - Z + B 2^s >= 1`);
- a split of the multipliers at bit k (`m = mh 2^k + ml`): the low part `pl = ua ml + ub mbl + cl`
  and the high part `e = ua mh + ub mbh + ch + (pl >> k)` are the dividend `e 2^k + (pl mod 2^k)`;
  `t < 0` is `e < theta` (the threshold a multiple of 2^k because k < s), and the `- [t < 0]`
  borrows from e only when the low bits are zero.

So `r = ((e - [e < theta and pl mod 2^k == 0]) >> (s - k)) - B`. `add32_params` proves that no
intermediate leaves [0, 2^32) for any pair of stored inputs (bounds from the types' ranges) and
then checks every one of the (at most 256 x 256) pairs against the simulator's arithmetic; where
either fails (shifts below 2, very large ones, wide types) the kernel keeps the 64-bit form.
"""

from __future__ import annotations

import attrs
import numpy as np
from qcc.backends.c.ctype import CType
from qcc.backends.c.kernels.elementwise import _broadcasting
from qcc.backends.c.kernels.helpers import KernelSet

from qcc.sim import affine_int as ai

SPLIT = 16
"""Bit at which the multipliers are split (lowered to s - 1 for small shifts)."""


@attrs.frozen
class Add32:
    """The constants of the 32-bit form (see the module docstring), in the order the kernel takes them."""

    k: int
    sk: int
    mah: int
    mal: int
    mbh: int
    mbl: int
    ch: int
    cl: int
    theta: int
    zb: int  # zy - B

    def args(self) -> list[str]:
        return [f"{v}u" for v in (self.mah, self.mal, self.mbh, self.mbl, self.ch, self.cl, self.theta)] + \
            [str(self.k), str(self.sk), str(self.zb)]


def add32_params(op: str, a: CType, b: CType, za: int, zb: int, ma: int, mb: int, s: int, zy: int) -> Add32 | None:
    """The 32-bit form's constants when it is provably the simulator's integer for every stored input pair."""
    if op not in ("Add", "Sub") or s < 2 or ma < 0 or mb < 0 or a.hi - a.lo > 255 or b.hi - b.lo > 255:
        return None
    k = min(SPLIT, s - 1)
    if s - k > 31:
        return None
    ua_max, ub_max = a.hi - a.lo, b.hi - b.lo
    za_off = za - a.lo
    zb_off = zb - b.lo if op == "Add" else b.hi - zb
    z = za_off * ma + zb_off * mb
    h = 1 << (s - 1)
    big = 0 if h - z >= 1 else -((h - z - 1) // (1 << s))  # B: the least with h - Z + B 2^s >= 1
    c = h - z + big * (1 << s)
    ch, cl = divmod(c, 1 << k)
    mah, mal = divmod(ma, 1 << k)
    mbh, mbl = divmod(mb, 1 << k)
    theta = big * (1 << (s - k)) + (1 << (s - 1 - k))
    pl_max = ua_max * mal + ub_max * mbl + cl
    e_max = ua_max * mah + ub_max * mbh + ch + (pl_max >> k)
    if c < 1 or pl_max >= 1 << 32 or e_max >= 1 << 32 or theta >= 1 << 32 or abs(zy - big) >= 1 << 30:
        return None
    p = Add32(k, s - k, mah, mal, mbh, mbl, ch, cl, theta, zy - big)
    return p if _exhaustive(p, op, a, b, za, zb, ma, mb, s, big) else None


def _exhaustive(p: Add32, op: str, a: CType, b: CType, za: int, zb: int, ma: int, mb: int, s: int, big: int) -> bool:
    """Every stored pair through the 32-bit form (int64 here: the bounds above keep it below 2^32)
    against `ai.rshift` of the simulator's 64-bit sum."""
    qa = np.arange(a.lo, a.hi + 1, dtype=np.int64)[:, None]
    qb = np.arange(b.lo, b.hi + 1, dtype=np.int64)[None, :]
    ua = qa - a.lo
    ub = qb - b.lo if op == "Add" else b.hi - qb
    pl = ua * p.mal + ub * p.mbl + p.cl
    e = ua * p.mah + ub * p.mbh + p.ch + (pl >> p.k)
    fix = (e < p.theta) & ((pl & ((1 << p.k) - 1)) == 0)
    got = ((e - fix) >> p.sk) - big
    sign = 1 if op == "Add" else -1
    want = ai.rshift((qa - za) * ma + sign * ((qb - zb) * mb), s)
    return bool(np.array_equal(got, want) and (e - fix).min() >= 0)


def _element(op: str, a: CType, b: CType) -> str:
    """The C statements computing the requantized output `r` (before saturation) from av, bv."""
    ub = f"(uint32_t)(bv - ({b.lo}))" if op == "Add" else f"(uint32_t)(({b.hi}) - bv)"
    return f"""const uint32_t ua = (uint32_t)(av - ({a.lo}));
const uint32_t ub = {ub};
const uint32_t pl = ua * mal + ub * mbl + cl;
const uint32_t e = ua * mah + ub * mbh + ch + (pl >> kl);
const uint32_t fix = (uint32_t)(e < theta) & (uint32_t)((pl & mask) == 0u);
const int32_t r = (int32_t)((e - fix) >> sk) + zb;"""


def add32_kernel(ks: KernelSet, op: str, a: CType, b: CType, y: CType) -> str:
    """Add/Sub with broadcasting (p == NULL: same shapes) in the 32-bit form; saturates to [ylo, yhi]
    (the type's range, or a fused clamp's: an affine Relu after a residual Add)."""
    name = f"qcc_{op.lower()}32_{a.suffix}_{b.suffix}_{y.suffix}"
    params = (f"const {a.name} *a, const {b.name} *b, {y.name} *y, long n, const qcc_bcast_t *p, uint32_t mah, "
              "uint32_t mal, uint32_t mbh, uint32_t mbl, uint32_t ch, uint32_t cl, uint32_t theta, int kl, int sk, "
              "int32_t zb, int32_t ylo, int32_t yhi")
    prologue = "const uint32_t mask = ((uint32_t)1 << kl) - 1u;\n    "
    expr = f"({y.name})(r < ylo ? ylo : (r > yhi ? yhi : r))"
    return ks.kernel(name, lambda: _broadcasting(name, params, "int32_t", expr, prologue, _element(op, a, b)),
                     ("bcast",))
