"""Shared C of the kernels: integer helpers, parameter structs, and the set one model emits.

Kernels are generated per element-type combination by the family modules beside this one
(`conv`, `pool`, `elementwise`, `normalization`, `movement`); a `KernelSet` collects the ones a
model uses, each after the helpers it calls, so only used code is emitted.
"""

from __future__ import annotations

import re
from collections.abc import Callable


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
/* t rounded half to even, |t| < 2^22: adding and subtracting 1.5 * 2^23 rounds in the default
   rounding mode, exactly (float arithmetic as written: FLT_EVAL_METHOD 0, no -ffast-math). No
   branch, so the loops calling it vectorize. */
static int32_t qcc_rint(float t)
{
    return (int32_t)((t + 12582912.0f) - 12582912.0f);
}
""", ()),
    "round": ("""
/* Input quantization: v * 2^frac rounded half to even, saturated; NaN gives 0. */
static int32_t qcc_round(float v, float scale, int32_t lo, int32_t hi)
{
    float t = v * scale;
    t = t != t ? 0.0f : t;
    t = t < (float)lo ? (float)lo : t;
    t = t > (float)hi ? (float)hi : t;
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
    "libm": ("", ()),  # a kernel calls a <math.h> function directly
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
""", ()),
    "bcast_next": ("""
/* One step of a broadcast walk, element by element (the PRelu kernels' slope index). */
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
""", ("bcast",)),
    "masked_pack": ("""
/* The float panel's stride-1 and stride-2 copies as AVX-512 masked loads (kernels/conv.py `pack`):
   lanes outside the input neither read memory nor fault. -DQCC_NO_INTRINSICS keeps the C loops. */
#if defined(__AVX512F__) && !defined(QCC_NO_INTRINSICS) && QCC_OB == 16
#include <immintrin.h>
#define QCC_MASKED_PACK 1
#ifndef QCC_PKT
#define QCC_PKT 16 /* taps whose masks a channel-by-channel fill keeps at once */
#endif
#else
#define QCC_MASKED_PACK 0
#endif
""", ("conv_t",)),
    "perm": ("""
/* Transpose: output shape and, per output axis, the input stride it walks. */
typedef struct {
    int rank;
    long shape[QCC_MAX_RANK];
    long stride[QCC_MAX_RANK];
} qcc_perm_t;
""", ()),
    "conv_t": ("""
/* Convolution and Dense tiling (kernels/conv.py). The micro-kernel keeps QCC_PB x QCC_OB sums in
   registers: QCC_OB (16) consecutive output positions (Dense: output columns) by QCC_PB (2, 4 or
   8, a divisor of the weights' block of QCC_WB output channels) output channels; QCC_OB and
   QCC_WB are fixed by the weight layout, QCC_PB follows the vector registers the compiler may use;
   the others may be overridden (-D) to trade stack for speed: a float tile keeps QCC_OS x QCC_OB
   sums and a panel of QCC_KC x QCC_OB inputs (12 KB with the defaults). */
#define QCC_OB 16
#define QCC_WB 8
#ifndef QCC_PB
#if defined(__AVX512F__)
#define QCC_PB 8 /* 8 rows of 16 floats: 8 of the 32 vector registers */
#else
#define QCC_PB 4 /* 4 rows: 8 of 16 registers with AVX, 16 of 16 (SSE2) or 32 (NEON) otherwise */
#endif
#endif
#ifndef QCC_KC
#define QCC_KC 128
#endif
#ifndef QCC_OS
#define QCC_OS 64
#endif
/* float convolutions: weight blocks of QCC_FWB output channels, QCC_FPB of them per micro-kernel
   call (16 x 16 sums in 16 of the 32 registers with AVX-512: 16 FMA chains hide the latency that
   8 did not; elsewhere QCC_PB), QCC_OS rounded up to whole blocks */
#define QCC_FWB 16
#ifndef QCC_FPB
#if defined(__AVX512F__)
#define QCC_FPB 16
#else
#define QCC_FPB QCC_PB
#endif
#endif
#define QCC_FOS ((QCC_OS + QCC_FWB - 1) / QCC_FWB * QCC_FWB)
/* whole tiles of flattened 1x1 float layers read their input in place (no panel) with 16-row tiles */
#ifndef QCC_FDIRECT
#if QCC_FPB >= 16
#define QCC_FDIRECT 1
#else
#define QCC_FDIRECT 0
#endif
#endif
#ifndef QCC_ROW
#define QCC_ROW 32
#endif
/* depthwise convolutions of stride 1 or 2 whose padded channel plane has at most QCC_DWPLANE
   elements run on a zero-padded copy split by stride phase (two stack arrays of that many
   elements); -DQCC_DWPLANE=0 keeps only the row loop (small stacks) */
#ifndef QCC_DWPLANE
#define QCC_DWPLANE 4096
#endif
#define QCC_DWV 16
/* fixed-point convolutions: QCC_FB output channels by row chunks of QCC_CHUNK positions
   (QCC_NARROW for narrow maps); QCC_SPAN is the widest (kw - 1) * dilation the row buffer serves */
#define QCC_FB 8
/* small maps of stride 1 whose padded input (all channels) has at most QCC_FXPLANE elements take
   the plane path (a stack array of that many): blocks of QCC_FXV positions, fixed-length loops;
   -DQCC_FXPLANE=0 keeps only the row path */
#ifndef QCC_FXPLANE
#define QCC_FXPLANE 4096
#endif
#ifndef QCC_FXV
#if defined(__AVX2__)
#define QCC_FXV 32 /* digits fixed8 -march=native: 74 us (16: 114, 8: 270) */
#else
#define QCC_FXV 16 /* SSE2: 180 us (8: 216, 32: 192) */
#endif
#endif
#define QCC_CHUNK 32
#define QCC_NARROW 8
#define QCC_SPAN 32
/* affine convolutions: dot products of QCC_MR weight rows with QCC_NR panel rows of at most QCC_KCI
   taps (the weight layout pads rows to multiples of QCC_KA taps: fixed), QCC_PT positions a tile */
#define QCC_MR 4
#define QCC_NR 4
#define QCC_KA 16
#ifndef QCC_PT
#define QCC_PT 8 /* output positions per affine tile (a multiple of QCC_NR) */
#endif
#ifndef QCC_KCI
#define QCC_KCI 256 /* taps per affine panel row (a multiple of QCC_KA) */
#endif
#ifndef QCC_BAND
#define QCC_BAND 8192 /* int16 elements of the transposed input rows (0: gather every tap instead) */
#endif
#define QCC_RING 16 /* the band serves kernels of at most this many rows */
#if QCC_PT % QCC_NR != 0 || QCC_KCI % QCC_KA != 0 || QCC_OS % QCC_MR != 0
#error "QCC_PT, QCC_KCI and QCC_OS must be multiples of QCC_NR, QCC_KA and QCC_MR"
#endif

typedef struct {
    int n, c, h, w, o, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, group;
} qcc_conv_t;
""", ("vector_loop",)),
    "pool_t": ("""
/* Pooling window: begin pads ph/pw, end pads eh/ew (count_include_pad counts them). Maps whose
   padded row needs at most QCC_POOLW entries pool through two row buffers of that size. */
#ifndef QCC_POOLW
#define QCC_POOLW 512
#endif
typedef struct {
    int n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, eh, ew, include_pad;
} qcc_pool_t;
""", ()),
    # affine mode (qcc.sim.affine_int): requantization, quantization, comparison
    "vector_loop": ("""
/* Before a fixed-length loop meant to become vector instructions: GCC would otherwise unroll a
   short one into scalar statements before it vectorizes loops (measured: a 16-element epilogue
   ran 2.5x the instructions). Other compilers get nothing. */
#if defined(__GNUC__) && !defined(__clang__)
#define QCC_VECTOR_LOOP _Pragma("GCC unroll 1")
#else
#define QCC_VECTOR_LOOP
#endif
""", ()),
    "noinline": ("""
/* A micro-kernel kept out of line: inlined into a convolution's loops (a model with one float
   convolution kernel), GCC 12 kept its 16 vector sums on the stack (squeezenet float 1.07x slower). */
#if defined(__GNUC__)
#define QCC_NOINLINE __attribute__((noinline))
#else
#define QCC_NOINLINE
#endif
""", ()),
    "vtile": ("""
/* The 16 x 16 float micro-kernel with its sums in AVX-512 registers by construction: written with
   arrays, GCC 12 passed all 16 sums through the stack on entry and exit (80 extra loads and stores
   a call; squeezenet's first layer sums 27 taps a call). The same operations in the same order:
   fused where QCC_MADD fuses (FP_FAST_FMAF), a multiply then an add otherwise. */
#if defined(__AVX512F__) && !defined(QCC_NO_INTRINSICS) && QCC_OB == 16 && QCC_FPB == 16
#include <immintrin.h>
#define QCC_VTILE 1
#if defined(FP_FAST_FMAF)
#define QCC_VMADD(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#else
#define QCC_VMADD(a, b, c) _mm512_add_ps((c), _mm512_mul_ps((a), (b)))
#endif
#else
#define QCC_VTILE 0
#endif
""", ("conv_t", "madd")),
    "prefetchw": ("""
/* A hint that a line is about to be written: the float convolution's epilogue stores 16 positions
   of each of up to 64 output planes per tile, more write streams than the hardware prefetcher
   follows, so every store missed (squeezenet's first layer: 3.2 MB of output, 0.8x with the hint).
   No effect on any value; other compilers get nothing. */
#if defined(__GNUC__)
#define QCC_PREFETCHW(a) __builtin_prefetch((a), 1, 3)
#else
#define QCC_PREFETCHW(a) ((void)0)
#endif
""", ()),
    "dispatch": ("""
/* Function multi-versioning of the convolution kernels in builds for the baseline instruction set
   (the Makefile's portable default): GCC (and clang >= 14) compile each for AVX-512, AVX2 and the
   baseline, and the loader picks the CPU's (glibc's ifunc, once per process). Same arithmetic in
   every version: integer kernels give the same bits; float kernels too, since QCC_MADD fuses only
   where the whole build targets FMA (FP_FAST_FMAF) and -ffp-contract=off forbids it elsewhere.
   Builds that already target AVX2 (ARCH_FLAGS), other compilers, systems or C libraries, and
   -DQCC_NO_DISPATCH get the plain functions. QCC_DISPATCH256: no AVX-512 version (the int16 and
   uint8 dot products, whose short sums lose on 512-bit vectors). */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__) && !defined(__AVX2__) \
    && !defined(QCC_NO_DISPATCH) && (!defined(__clang__) || __clang_major__ >= 14)
#define QCC_DISPATCH __attribute__((target_clones("avx512f", "avx2", "default")))
#define QCC_DISPATCH256 __attribute__((target_clones("avx2", "default")))
#else
#define QCC_DISPATCH
#define QCC_DISPATCH256
#endif
""", ()),
    "madd": ("""
/* c + a * b, fused when the target has a fast fmaf (FP_FAST_FMAF, e.g. -march with FMA): float
   kernels only, whose results are compared with a tolerance, never bit for bit. */
#if defined(FP_FAST_FMAF)
#define QCC_MADD(a, b, c) fmaf((a), (b), (c))
#else
#define QCC_MADD(a, b, c) ((c) + (a) * (b))
#endif
""", ()),
    "requant": ("""
/* zp + v * m / 2^s rounded half away from zero, saturated to [lo, hi] (|v * m| < 2^62, s <= 62);
   branch-free, so loops calling it vectorize. */
static int32_t qcc_requant(int64_t v, int64_t m, int s, int32_t zp, int32_t lo, int32_t hi)
{
    const int64_t prod = v * m;
    const uint64_t mag = prod < 0 ? (uint64_t)0 - (uint64_t)prod : (uint64_t)prod;
    const uint64_t q = (mag + (((uint64_t)1 << s) >> 1)) >> s;
    const int64_t r = (prod < 0 ? -(int64_t)q : (int64_t)q) + zp;
    return r < lo ? lo : (r > hi ? hi : (int32_t)r);
}
""", ()),
    "requant32": ("""
/* qcc_requant of an accumulator that fits int32 (the sum with its bias: the affine mode refuses
   layers whose sum could overflow) by a multiplier m >= 0: the product's sign is t's, and the
   32 x 32 -> 64-bit product is one instruction where the 64 x 64 one is several (vpmuldq). */
static int32_t qcc_requant32(int32_t t, int32_t m, int s, int32_t zp, int32_t lo, int32_t hi)
{
    const int64_t prod = (int64_t)t * m;
    const uint64_t mag = t < 0 ? (uint64_t)0 - (uint64_t)prod : (uint64_t)prod;
    const uint64_t q = (mag + (((uint64_t)1 << s) >> 1)) >> s;
    const int64_t r = (t < 0 ? -(int64_t)q : (int64_t)q) + zp;
    return r < lo ? lo : (r > hi ? hi : (int32_t)r);
}
""", ()),
    "quantize": ("""
/* zp + v / scale rounded half to even, saturated to [lo, hi]; NaN gives zp. */
static int32_t qcc_quantize(float v, float scale, int32_t zp, int32_t lo, int32_t hi)
{
    float t = v / scale;
    t = t != t ? 0.0f : t;
    t = t < (float)(lo - zp) ? (float)(lo - zp) : t;
    t = t > (float)(hi - zp) ? (float)(hi - zp) : t;
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
}

MATH_HELPERS = frozenset({"expf", "tanhf", "libm", "madd"})


class KernelSet:
    """The helpers and kernels one model needs, in dependency order."""

    def __init__(self) -> None:
        self.code: dict[str, str] = {}
        self.uses_math = False
        self.kernels: set[str] = set()

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
            code = make()
            if "QCC_DISPATCH" in code:  # QCC_DISPATCH256 included
                self.helper("dispatch")
            self.code[name] = code
            self.kernels.add(name)
        return name

    def prune(self, body: str) -> None:
        """Drop the kernels neither `body` nor another kernel calls (a Concat whose inputs were all
        written in place): unused static functions are warnings, errors under -Werror."""
        while True:
            unused = [name for name in self.kernels if not any(
                re.search(rf"\b{name}\(", text) for text in (body, *(c for k, c in self.code.items() if k != name)))]
            if not unused:
                return
            for name in unused:
                self.kernels.discard(name)
                del self.code[name]

    def source(self) -> str:
        return "".join(self.code.values())


def signature(name: str, params: list[str]) -> str:
    return f"static void {name}({', '.join(params)})"

