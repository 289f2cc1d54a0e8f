"""The affine convolution of `c{isa=dot8}`: four uint8 x int8 products a 32-bit lane, weights broadcast.

The dot-product kernel (`conv.conv_affine`) reduces each output's taps along a vector and pays a
horizontal sum per output; short sums (1x1 layers of 32-64 channels, a first layer of 27 taps)
therefore ran on the exact-float tile instead. This kernel keeps 16 output channels x 16 output
positions of sums in 16 vectors, one per channel, its lanes the positions: per group of four taps
it loads the panel's 64 bytes (16 positions x 4 taps) once and adds, per output channel, the four
weights broadcast to every lane times them (AVX512-VNNI: one `vpdpbusd` each; no horizontal sum,
any number of taps). The sums are exact integers in any order, so the portable C loop that
compilers without VNNI run computes the same bits (`qcc.sim.affine_int`).

Weights (`pack_dot8_weights`): per group, blocks of 16 output channels, per tap (ky, kx) the input
channels padded to a multiple of 4 (`cg4`), as `[k / 4][16 channels][4 taps]`. The panel holds
x - lo (`conv._panel_offset`; the bias is `conv.offset_bias`'s) as `[k / 4][16 positions][4 taps]`,
packed for QCC_K4 taps at a time from the input (contiguous 16-position rows copied as runs).
"""

from __future__ import annotations

import attrs
import numpy as np
from qcc.backends.c.ctype import CType
from qcc.backends.c.kernels.conv import Epilogue, _indent
from qcc.backends.c.kernels.helpers import KernelSet

LANES = 16
"""Output positions per tile (the vector's 32-bit lanes) and output channels per weight block."""
MIN_POSITIONS = 8
"""Maps with fewer output positions (Dense, 1x1 maps) keep the dot-product kernel: a tile of 16
positions would compute mostly padding."""


def pack_dot8_weights(w: np.ndarray, group: int) -> np.ndarray:
    """Centered OIHW int8 weights -> per group, blocks of 16 output channels (zero-padded), each
    `[tap][cg4 / 4][16][4]`: tap-major (ky, kx), input channels padded to a multiple of 4."""
    o, cg, kh, kw = w.shape
    og = o // group
    cg4 = -(-cg // 4) * 4
    blocks = -(-og // LANES)
    per = np.zeros((group, blocks * LANES, kh, kw, cg4), dtype=w.dtype)
    per[:, :og, :, :, :cg] = w.reshape(group, og, cg, kh, kw).transpose(0, 1, 3, 4, 2)
    kp4 = kh * kw * cg4 // 4
    return per.reshape(group, blocks, LANES, kp4, 4).transpose(0, 1, 3, 2, 4).reshape(-1)


def uses_dot8_tiles(weights_shape: tuple[int, ...], out_positions: int) -> bool:
    """Maps of at least MIN_POSITIONS output positions (the tile's lanes are positions)."""
    return out_positions >= MIN_POSITIONS and len(weights_shape) == 4


WIDE = "int32_t r = qcc_requant((int64_t)v + bo, mo, so,"


def narrow_requant(ep: Epilogue) -> Epilogue:
    """The affine epilogue on 32-bit sums (`qcc_requant32`): the sum plus its bias fits int32 (the
    affine mode's accumulator check), and the multipliers are positive."""
    if not ep.element.startswith(WIDE):
        return ep
    element = ep.element.replace(WIDE, "int32_t r = qcc_requant32(v + bo, mo, so,", 1)
    # the 64-bit helper only where something else still calls it (else an unused static function:
    # a model whose every convolution takes these tiles failed -Werror's unused-function)
    helpers = tuple(h for h in ep.helpers if h != "requant" or "qcc_requant(" in element + ep.post)
    return attrs.evolve(ep, element=element, helpers=(*helpers, "requant32"))


def _requant16(ep: Epilogue, y: CType) -> str:
    """The epilogue of 16 sums as AVX-512 intrinsics (under QCC_NARROW16) for channels whose shift is
    at least 32, else nothing: `qcc_requant32` (and a fused clamp) on the vector. rshift(t m, s) is
    floor((t m + 2^62 + 2^(s-1) - [t m < 0]) / 2^s) - 2^(62-s) (the dividend nonnegative, below 2^64;
    a product of 0 adds the same floor either way), two signed 32 x 32 -> 64-bit products per pair of
    lanes (vpmuldq); with s >= 32 the result is below 2^30 in magnitude, so the low 32 bits of each
    quotient, less 2^(62-s), plus zy, are the int32 value qcc_requant32 saturates: the same bits.
    GCC's own vectorization of qcc_requant32 (64-bit compares, blends and permutes) was the largest
    part of resnet23's epilogues."""
    if ep.post or ep.suffix not in ("", "_c") or not ep.element.startswith("int32_t r = qcc_requant32(v + bo, mo, so,"):
        return ""
    clamp = ("    rv = _mm512_min_epi32(_mm512_max_epi32(rv, _mm512_set1_epi32(clo)), _mm512_set1_epi32(chi));\n"
             if ep.suffix == "_c" else "")
    return f"""#if QCC_NARROW16
if (so >= 32) {{
    const __m512i tv = _mm512_add_epi32(_mm512_loadu_si512((const void *)(part + o * 16)), _mm512_set1_epi32(bo));
    const __m512i mv = _mm512_set1_epi32(mo);
    const __m512i cv = _mm512_set1_epi64((long long)(((uint64_t)1 << 62) + ((uint64_t)1 << (so - 1))));
    const __m128i sv = _mm_cvtsi32_si128(so);
    const __m512i pe = _mm512_mul_epi32(tv, mv);
    const __m512i po = _mm512_mul_epi32(_mm512_srli_epi64(tv, 32), mv);
    const __m512i ue = _mm512_srl_epi64(_mm512_add_epi64(_mm512_add_epi64(pe, cv), _mm512_srai_epi64(pe, 63)), sv);
    const __m512i uo = _mm512_srl_epi64(_mm512_add_epi64(_mm512_add_epi64(po, cv), _mm512_srai_epi64(po, 63)), sv);
    __m512i rv = _mm512_mask_blend_epi32((__mmask16)0xAAAA, ue, _mm512_slli_epi64(uo, 32));
    rv = _mm512_add_epi32(rv, _mm512_set1_epi32(zy - (1 << (62 - so))));
    rv = _mm512_min_epi32(_mm512_max_epi32(rv, _mm512_set1_epi32({y.lo})), _mm512_set1_epi32({y.hi}));
{clamp}    _mm512_storeu_si512((void *)out, rv);
}} else
#endif
"""


def _micro(ks: KernelSet) -> str:
    name = "qcc_dot4_u8_i8"
    accs = range(LANES)
    load = "\n".join(f"    __m512i a{o} = _mm512_loadu_si512((const void *)(acc + {o} * 16));" for o in accs)
    macs = "\n".join(f"        memcpy(&b, wk + {o * 4}, 4);\n        a{o} = _mm512_dpbusd_epi32(a{o}, xv, "
                     "_mm512_set1_epi32(b));" for o in accs)
    store = "\n".join(f"    _mm512_storeu_si512((void *)(acc + {o} * 16), a{o});" for o in accs)
    return ks.kernel(name, lambda: f"""
/* acc[o * 16 + q] += sum over k4 groups of four taps of w[k][o][0..3] . panel[k][q][0..3] (uint8 x
   int8, exact in int32): 16 output channels x 16 output positions. AVX512-VNNI: one vpdpbusd per
   group and channel, the channel's four weights broadcast to the 16 positions; elsewhere the same
   integer sums in C (any order gives the same bits). */
#if defined(__AVX512VNNI__) && defined(__AVX512F__) && !defined(QCC_NO_INTRINSICS)
#include <immintrin.h>
static void {name}(const uint8_t *restrict panel, const int8_t *restrict w, long k4, int32_t *restrict acc)
{{
{load}
    long k;
    for (k = 0; k < k4; ++k) {{
        const __m512i xv = _mm512_loadu_si512((const void *)(panel + k * 64));
        const int8_t *restrict wk = w + k * 64;
        int32_t b;
{macs}
    }}
{store}
}}
#else
static void {name}(const uint8_t *restrict panel, const int8_t *restrict w, long k4, int32_t *restrict acc)
{{
    long k;
    int o, q;
    for (k = 0; k < k4; ++k) {{
        const uint8_t *restrict xk = panel + k * 64;
        const int8_t *restrict wk = w + k * 64;
        for (o = 0; o < 16; ++o) {{
            const int32_t w0 = wk[o * 4 + 0];
            const int32_t w1 = wk[o * 4 + 1];
            const int32_t w2 = wk[o * 4 + 2];
            const int32_t w3 = wk[o * 4 + 3];
            QCC_VECTOR_LOOP
            for (q = 0; q < 16; ++q) {{
                acc[o * 16 + q] += w0 * xk[q * 4 + 0] + w1 * xk[q * 4 + 1] + w2 * xk[q * 4 + 2] + w3 * xk[q * 4 + 3];
            }}
        }}
    }}
}}
#endif
""", ("vector_loop",))


def _pack(ks: KernelSet, x: CType) -> str:
    name = f"qcc_pack4_{x.suffix}"
    off = f"(-({x.lo}))"

    def interleave(src: str) -> str:
        return "".join(f"dst[q * 4 + {t}] = (uint8_t)((int32_t){src.format(t=t)} + {off});\n" for t in range(4))

    off_byte = (-x.lo) & 0xFF
    off_byte = off_byte - 256 if off_byte > 127 else off_byte  # x - lo in uint8 is x + off_byte, wrapping
    return ks.kernel(name, lambda: f"""
#ifndef QCC_BW_ROWS /* stride-1 tiles' panels by AVX-512BW masked loads (no fault past the mask) */
#if defined(__AVX512BW__) && defined(__AVX512VL__) && !defined(QCC_NO_INTRINSICS)
#define QCC_BW_ROWS 1
#include <immintrin.h>
/* dst[q * 4 + t] = rt[q] + ov (x - lo), q < 16: two rounds of byte / word unpacks */
static void qcc_interleave4(uint8_t *restrict dst, __m128i r0, __m128i r1, __m128i r2, __m128i r3, __m128i ov)
{{
    const __m128i a = _mm_add_epi8(r0, ov), b = _mm_add_epi8(r1, ov);
    const __m128i c = _mm_add_epi8(r2, ov), d = _mm_add_epi8(r3, ov);
    const __m128i ab0 = _mm_unpacklo_epi8(a, b), ab1 = _mm_unpackhi_epi8(a, b);
    const __m128i cd0 = _mm_unpacklo_epi8(c, d), cd1 = _mm_unpackhi_epi8(c, d);
    _mm_storeu_si128((__m128i *)(void *)dst, _mm_unpacklo_epi16(ab0, cd0));
    _mm_storeu_si128((__m128i *)(void *)(dst + 16), _mm_unpackhi_epi16(ab0, cd0));
    _mm_storeu_si128((__m128i *)(void *)(dst + 32), _mm_unpacklo_epi16(ab1, cd1));
    _mm_storeu_si128((__m128i *)(void *)(dst + 48), _mm_unpackhi_epi16(ab1, cd1));
}}
#else
#define QCC_BW_ROWS 0
#endif
#endif
/* panel[(k - k0) / 4][q][k % 4] = x - lo at tap k (k0 <= k < k0 + kc, k = (ky * kw + kx) * cg4 + input
   channel; k0 and kc multiples of 4) of the tile's output position q (< 16; iy0/ix0: its window's
   corner, far outside for positions past the map): zx - lo outside the input, and for the channels
   past cg (their weights are 0). A tile inside one output row with stride 1 along x (`row`) reads
   each tap's 16 inputs consecutively: in place when they are all inside, else one clipped run
   copied into a row preset to zx; other tiles gather through offsets and a mask. */
static void {name}(const {x.name} *restrict x, uint8_t *restrict panel, const qcc_conv_t *restrict p,
    const int *restrict iy0, const int *restrict ix0, int row, long k0, long kc, int32_t zx)
{{
    const int cg = p->c / p->group;
    const int cg4 = (cg + 3) / 4 * 4;
    const long hw = (long)p->h * p->w;
    {x.name} rows[4][16];
    long off[16];
    int32_t mask[16];
    long k = k0;
    int q;
#if QCC_BW_ROWS
    /* stride 1 along x: the tile's positions fall into runs of consecutive output columns of one row
       (two or three where the tile crosses rows), each tap's inputs for a run one contiguous stretch:
       per channel one masked load per run, merged into one vector (zx where no run reads) */
    const __m128i zv = _mm_set1_epi8((char)zx);
    const __m128i ov = _mm_set1_epi8((char){off_byte});
    int nr = 0, r, ra[16], rb[16];
    __mmask16 keep, rk[16];
    long rbase[16];
    if (p->sw == 1 && !row) {{
        for (q = 0; q < 16 && iy0[q] != -(1 << 29); ++q) {{
            if (q == 0 || iy0[q] != iy0[q - 1] || ix0[q] != ix0[q - 1] + 1) {{
                ra[nr++] = q;
            }}
            rb[nr - 1] = q + 1;
        }}
    }}
#endif
    while (k < k0 + kc) {{
        const int tap = (int)(k / cg4);
        const int dy = tap / p->kw * p->dh;
        const int dx = tap % p->kw * p->dw;
        const int end = k0 + kc - k < cg4 - k % cg4 ? (int)(k % cg4 + k0 + kc - k) : cg4;
        uint8_t *restrict dst = panel + (k - k0) * 16;
        int lo = 0, hi = 0, ic, t;
        long base = 0;
        if (row) {{ /* inputs base + lo .. base + hi - 1 are the positions lo .. hi - 1 */
            const int iy = iy0[0] + dy;
            const int ix = ix0[0] + dx;
            if (iy >= 0 && iy < p->h) {{
                lo = ix >= 0 ? 0 : (-ix < 16 ? -ix : 16);
                hi = p->w - ix < 16 ? (p->w - ix > lo ? p->w - ix : lo) : 16;
                base = (long)iy * p->w + ix;
            }}
        }} else {{
            for (q = 0; q < 16; ++q) {{
                const int iy = iy0[q] + dy;
                const int ix = ix0[q] + dx;
                const int inside = iy >= 0 && iy < p->h && ix >= 0 && ix < p->w;
                off[q] = inside ? (long)iy * p->w + ix : 0;
                mask[q] = inside ? -1 : 0;
            }}
        }}
#if QCC_BW_ROWS
        keep = (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
        for (r = 0; r < nr; ++r) {{ /* run r: lanes ra..rb-1 read base + lane, those inside the input */
            const int iy = iy0[ra[r]] + dy;
            const int ix = ix0[ra[r]] + dx;
            const int a = ix >= 0 ? ra[r] : ra[r] - ix;
            const int b = p->w - ix < rb[r] - ra[r] ? ra[r] + p->w - ix : rb[r];
            rk[r] = iy >= 0 && iy < p->h && b > a ? (__mmask16)(((1u << b) - 1u) & ~((1u << a) - 1u)) : 0;
            rbase[r] = (long)iy * p->w + ix - ra[r];
        }}
#endif
        for (ic = (int)(k % cg4); ic < end; ic += 4, dst += 64) {{
            if (row && lo == 0 && hi == 16 && ic + 4 <= cg) {{
                const {x.name} *restrict x0 = x + (long)ic * hw + base;
                const {x.name} *restrict x1 = x0 + hw;
                const {x.name} *restrict x2 = x1 + hw;
                const {x.name} *restrict x3 = x2 + hw;
                for (q = 0; q < 16; ++q) {{
{_indent(interleave("x{t}[q]"), 20)}                }}
                continue;
            }}
#if QCC_BW_ROWS
            if (row) {{ /* clipped runs, channels past cg: masked loads (zx outside), interleaved by unpacks */
                const {x.name} *restrict xb = x + (long)ic * hw + base;
                const __m128i r0 = keep ? _mm_mask_loadu_epi8(zv, keep, (const void *)xb) : zv;
                const __m128i r1 = keep && ic + 1 < cg ? _mm_mask_loadu_epi8(zv, keep, (const void *)(xb + hw)) : zv;
                const __m128i r2 = keep && ic + 2 < cg ? _mm_mask_loadu_epi8(zv, keep, (const void *)(xb + 2 * hw)) : zv;
                const __m128i r3 = keep && ic + 3 < cg ? _mm_mask_loadu_epi8(zv, keep, (const void *)(xb + 3 * hw)) : zv;
                qcc_interleave4(dst, r0, r1, r2, r3, ov);
                continue;
            }}
            if (nr > 0) {{ /* tiles crossing rows: one masked load per run, merged */
                const {x.name} *restrict xb = x + (long)ic * hw;
                __m128i r0 = zv, r1 = zv, r2 = zv, r3 = zv;
                for (r = 0; r < nr; ++r) {{
                    if (rk[r]) {{
                        r0 = _mm_mask_loadu_epi8(r0, rk[r], (const void *)(xb + rbase[r]));
                        r1 = ic + 1 < cg ? _mm_mask_loadu_epi8(r1, rk[r], (const void *)(xb + hw + rbase[r])) : r1;
                        r2 = ic + 2 < cg ? _mm_mask_loadu_epi8(r2, rk[r], (const void *)(xb + 2 * hw + rbase[r])) : r2;
                        r3 = ic + 3 < cg ? _mm_mask_loadu_epi8(r3, rk[r], (const void *)(xb + 3 * hw + rbase[r])) : r3;
                    }}
                }}
                qcc_interleave4(dst, r0, r1, r2, r3, ov);
                continue;
            }}
#endif
            for (t = 0; t < 4; ++t) {{
                const {x.name} *restrict xc = x + (long)(ic + t < cg ? ic + t : 0) * hw;
                if (row) {{
                    for (q = 0; q < 16; ++q) {{
                        rows[t][q] = ({x.name})zx;
                    }}
                    if (ic + t < cg && hi > lo) {{
                        memcpy(rows[t] + lo, xc + base + lo, (size_t)(hi - lo));
                    }}
                }} else {{
                    const int32_t keep = ic + t < cg ? -1 : 0;
                    for (q = 0; q < 16; ++q) {{
                        rows[t][q] = ({x.name})((((int32_t)xc[off[q]] - zx) & mask[q] & keep) + zx);
                    }}
                }}
            }}
            for (q = 0; q < 16; ++q) {{
{_indent(interleave("rows[{t}][q]"), 16)}            }}
        }}
        k = (long)tap * cg4 + end;
    }}
}}
""", ("conv_t",))


def _pack_plane(ks: KernelSet) -> str:
    name = "qcc_pack4p"
    return ks.kernel(name, lambda: f"""
#ifndef QCC_A8PLANE /* bytes of a group's zero-padded input for the plane path (0: never) */
#if defined(__AVX512VNNI__) && defined(__AVX512F__) && !defined(QCC_NO_INTRINSICS)
#define QCC_A8PLANE 4096
#else
#define QCC_A8PLANE 0 /* the C dot loop: the padding columns' extra sums cost more than the gathers
                         (digits: 84 against 72 us with -mavx2) */
#endif
#endif
#if QCC_A8PLANE > 0
#if defined(__SSE2__) && !defined(QCC_NO_INTRINSICS)
#include <emmintrin.h>
#endif
/* The plane path's panel: panel[(k - k0) / 4][q][k % 4] = plane[channel][p0 + q + tap offset], the
   plane already holding x - lo in padded rows of pw_ columns (channels past cg: zx - lo), so every
   tap of a tile is 16 consecutive bytes of 4 channels, interleaved. */
static void {name}(const uint8_t *restrict plane, uint8_t *restrict panel, const qcc_conv_t *restrict p,
    long ps, int pw_, long p0, long k0, long kc)
{{
    const int cg4 = (p->c / p->group + 3) / 4 * 4;
    long k;
    int q;
    for (k = k0; k < k0 + kc; k += 4) {{
        const int tap = (int)(k / cg4);
        const long at = p0 + (long)(tap / p->kw) * p->dh * pw_ + (long)(tap % p->kw) * p->dw;
        const uint8_t *restrict x0 = plane + (k % cg4) * ps + at;
        const uint8_t *restrict x1 = x0 + ps;
        const uint8_t *restrict x2 = x1 + ps;
        const uint8_t *restrict x3 = x2 + ps;
#if defined(__SSE2__) && !defined(QCC_NO_INTRINSICS)
        {{ /* two rounds of byte / word unpacks: positions 0-3, 4-7, 8-11, 12-15 */
            const __m128i a = _mm_loadu_si128((const __m128i *)(const void *)x0);
            const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)x1);
            const __m128i c = _mm_loadu_si128((const __m128i *)(const void *)x2);
            const __m128i d = _mm_loadu_si128((const __m128i *)(const void *)x3);
            const __m128i ab0 = _mm_unpacklo_epi8(a, b), ab1 = _mm_unpackhi_epi8(a, b);
            const __m128i cd0 = _mm_unpacklo_epi8(c, d), cd1 = _mm_unpackhi_epi8(c, d);
            uint8_t *restrict dst = panel + (k - k0) * 16;
            _mm_storeu_si128((__m128i *)(void *)dst, _mm_unpacklo_epi16(ab0, cd0));
            _mm_storeu_si128((__m128i *)(void *)(dst + 16), _mm_unpackhi_epi16(ab0, cd0));
            _mm_storeu_si128((__m128i *)(void *)(dst + 32), _mm_unpacklo_epi16(ab1, cd1));
            _mm_storeu_si128((__m128i *)(void *)(dst + 48), _mm_unpackhi_epi16(ab1, cd1));
            (void)q;
        }}
#else
        for (q = 0; q < 16; ++q) {{
            uint8_t *restrict dst = panel + (k - k0) * 16 + q * 4;
            dst[0] = x0[q];
            dst[1] = x1[q];
            dst[2] = x2[q];
            dst[3] = x3[q];
        }}
#endif
    }}
}}
#endif
""", ("conv_t",))


def conv_affine_dot8(ks: KernelSet, x: CType, y: CType, ep: Epilogue) -> str:
    """Per group, QCC_OS4 output channels (a multiple of 16) at a time, tiles of 16 consecutive output
    positions (flattened over the map); per tile, QCC_K4 taps at a time packed once and multiplied by
    every 16-channel block; then the bias, requantization and what the lowering fused (`ep`), a
    fixed-length loop per output channel."""
    name = f"qcc_conv4_{x.suffix}_{y.suffix}{ep.suffix}"
    pack, dot, packp = _pack(ks, x), _micro(ks), _pack_plane(ks)
    ep = narrow_requant(ep)
    for helper in ep.helpers:
        ks.helper(helper)
    params = "".join(f", {p}" for p in ep.params)

    def store(dst: str, whole: str) -> str:
        """16 consecutive outputs as one fixed-length loop (a narrowing vector store) when `whole`
        holds; the outputs one at a time otherwise, and always after `post` statements (a lookup)."""
        if ep.post:
            return ""
        return (f"if ({whole}) {{\n    {y.name} *restrict yr = {dst};\n#if QCC_NARROW16\n"
                "    _mm_storeu_si128((__m128i *)(void *)yr, _mm512_cvtepi32_epi8(_mm512_loadu_si512((const void *)out)));\n"
                f"#else\n    QCC_VECTOR_LOOP\n    for (q = 0; q < 16; ++q) {{\n        yr[q] = ({y.name})out[q];\n    }}\n"
                "#endif\n}\n")

    requant16 = _requant16(ep, y)

    def outputs16(offset: str) -> str:
        """Output channel `o` of a tile: its 16 sums requantized into out[] (both tile paths, up to
        the store)."""
        return (f"const int oc = g * og + ob0 + o;\n{y.name} *restrict yo = y + ((long)n * p->o + oc) * npix{offset};\n"
                f"int32_t out[16];\n{_indent(ep.channel, 0)}{_indent(requant16, 0)}{{\n    QCC_VECTOR_LOOP\n"
                f"    for (q = 0; q < 16; ++q) {{\n        const int32_t v = part[o * 16 + q];\n"
                f"{_indent(ep.element, 8)}        out[q] = r;\n    }}\n}}\n")

    # the plane path's tile stores 16 consecutive outputs when none of its positions is a padding column
    contiguous = "" if ep.post else ("int run = at[0] >= 0;\nfor (q = 1; q < 16; ++q) {\n"
                                     "    run &= at[q] == at[0] + q;\n}\n")

    return ks.kernel(name, lambda: f"""
#ifndef QCC_NARROW16 /* 16 requantized int32 values stored as bytes by one vpmovdb (GCC 12's own code for
                        the narrowing loop is a chain of extracts and permutes) */
#if defined(__AVX512F__) && !defined(QCC_NO_INTRINSICS)
#define QCC_NARROW16 1
#include <immintrin.h>
#else
#define QCC_NARROW16 0
#endif
#endif
#ifndef QCC_K4
#define QCC_K4 512 /* taps per dot8 panel (a multiple of 4; the panel is 16 x QCC_K4 bytes) */
#endif
#ifndef QCC_OS4
#define QCC_OS4 64 /* output channels whose sums a dot8 tile keeps (a multiple of 16) */
#endif
#if QCC_K4 % 4 != 0 || QCC_OS4 % 16 != 0
#error "QCC_K4 must be a multiple of 4 and QCC_OS4 a multiple of 16"
#endif
static void {name}(const {x.name} *restrict x, const int8_t *restrict w, {y.name} *restrict y,
    const qcc_conv_t *restrict p, int32_t zx, const int32_t *restrict bias, const int32_t *restrict mult,
    const int32_t *restrict shift{params})
{{
    const int cg = p->c / p->group;
    const int og = p->o / p->group;
    const int blocks = (og + 15) / 16;
    const long npix = (long)p->oh * p->ow;
    const long kp = (long)p->kh * p->kw * ((cg + 3) / 4 * 4);
    uint8_t panel[16 * QCC_K4];
    int32_t part[QCC_OS4 * 16];
    int iy0[16], ix0[16];
    int n, g, ob0, o, q, row;
    long p0, k0, j;
#if QCC_A8PLANE > 0
    /* the plane path (stride 1, small maps): the group's input channels (cg4 of them) zero-padded
       once into rows of pw_ columns; tiles of 16 positions of that layout (oy * pw_ + ox), so each
       tap of a tile reads 16 consecutive bytes, never gathers; positions with ox >= ow are computed
       and dropped. On 8x8 maps a tile spans two output rows and the gathers were most of the time. */
    const int cg4 = (cg + 3) / 4 * 4;
    const int pw_ = p->ow + (p->kw - 1) * p->dw;
    const long nq = ((long)p->oh * pw_ + 15) / 16 * 16;
    const long ps = nq + (long)(p->kh - 1) * p->dh * pw_ + (p->kw - 1) * p->dw;
    const int plane = p->sh == 1 && p->sw == 1 && cg4 * ps <= QCC_A8PLANE;
    uint8_t buf[QCC_A8PLANE > 0 ? QCC_A8PLANE : 1];
#endif
    for (n = 0; n < p->n; ++n) {{
        for (g = 0; g < p->group; ++g) {{
            const {x.name} *restrict xg = x + ((long)n * p->c + (long)g * cg) * p->h * p->w;
#if QCC_A8PLANE > 0
            if (plane) {{
                int ic, iy, ix;
                for (j = 0; j < cg4 * ps; ++j) {{
                    buf[j] = (uint8_t)(zx - ({x.lo}));
                }}
                for (ic = 0; ic < cg; ++ic) {{
                    for (iy = 0; iy < p->h; ++iy) {{
                        const long at = (long)ic * ps + (long)(iy + p->ph) * pw_ + p->pw;
                        if (iy + p->ph < 0 || (long)(iy + p->ph) * pw_ + pw_ > ps) {{
                            continue;
                        }}
                        for (ix = 0; ix < p->w; ++ix) {{
                            if (ix + p->pw >= 0 && ix + p->pw < pw_) {{
                                buf[at + ix] = (uint8_t)((int32_t)xg[((long)ic * p->h + iy) * p->w + ix] - ({x.lo}));
                            }}
                        }}
                    }}
                }}
                for (ob0 = 0; ob0 < og; ob0 += QCC_OS4) {{
                    const int nb = og - ob0 < QCC_OS4 ? og - ob0 : QCC_OS4;
                    for (p0 = 0; p0 < nq; p0 += 16) {{
                        int at[16]; /* where position q of the tile is stored (-1: a padding column) */
                        for (q = 0; q < 16; ++q) {{
                            const int oy = (int)((p0 + q) / pw_);
                            const int ox = (int)(p0 + q - (long)oy * pw_);
                            at[q] = oy < p->oh && ox < p->ow ? oy * p->ow + ox : -1;
                        }}
{_indent(contiguous, 24)}
                        for (j = 0; j < (long)(nb + 15) / 16 * 256; ++j) {{
                            part[j] = 0;
                        }}
                        for (k0 = 0; k0 < kp; k0 += QCC_K4) {{
                            const long kc = kp - k0 < QCC_K4 ? kp - k0 : QCC_K4;
                            {packp}(buf, panel, p, ps, pw_, p0, k0, kc);
                            for (o = 0; o < nb; o += 16) {{
                                {dot}(panel, w + (((long)g * blocks + (ob0 + o) / 16) * kp + k0) * 16, kc / 4, part + o * 16);
                            }}
                        }}
                        for (o = 0; o < nb; ++o) {{
{_indent(outputs16(""), 28)}{_indent(store("yo + at[0]", "run"), 28)}                            for (q = 0; q < 16{"" if ep.post else " && !run"}; ++q) {{
                                if (at[q] >= 0) {{
                                    int32_t r = out[q];
{_indent(ep.post, 36)}                                    yo[at[q]] = ({y.name})r;
                                }}
                            }}
                        }}
                    }}
                }}
                continue;
            }}
#endif
            for (ob0 = 0; ob0 < og; ob0 += QCC_OS4) {{
                const int nb = og - ob0 < QCC_OS4 ? og - ob0 : QCC_OS4;
                for (p0 = 0; p0 < npix; p0 += 16) {{
                    const int pn = npix - p0 < 16 ? (int)(npix - p0) : 16;
                    for (q = 0; q < 16; ++q) {{
                        iy0[q] = q < pn ? (int)((p0 + q) / p->ow) * p->sh - p->ph : -(1 << 29);
                        ix0[q] = q < pn ? (int)((p0 + q) % p->ow) * p->sw - p->pw : -(1 << 29);
                    }}
                    row = pn == 16 && p->sw == 1 && iy0[15] == iy0[0];
                    for (j = 0; j < (long)(nb + 15) / 16 * 256; ++j) {{
                        part[j] = 0;
                    }}
                    for (k0 = 0; k0 < kp; k0 += QCC_K4) {{
                        const long kc = kp - k0 < QCC_K4 ? kp - k0 : QCC_K4;
                        {pack}(xg, panel, p, iy0, ix0, row, k0, kc, zx);
                        for (o = 0; o < nb; o += 16) {{
                            {dot}(panel, w + (((long)g * blocks + (ob0 + o) / 16) * kp + k0) * 16, kc / 4, part + o * 16);
                        }}
                    }}
                    for (o = 0; o < nb; ++o) {{
{_indent(outputs16(" + p0"), 24)}{_indent(store("yo", "pn == 16"), 24)}                        for (q = 0; q < pn{"" if ep.post else " && pn < 16"}; ++q) {{
                            int32_t r = out[q];
{_indent(ep.post, 28)}                            yo[q] = ({y.name})r;
                        }}
                    }}
                }}
            }}
        }}
    }}
}}
""", ("conv_t",))
