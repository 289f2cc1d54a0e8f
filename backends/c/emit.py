"""The files of target c: <name>.h (API), <name>.c (kernels, weights, run), main.c, Makefile."""

from __future__ import annotations

from collections.abc import Callable

import attrs
from qcc.backends.c.ctype import comment_text, string_literal
from qcc.backends.c.kernels import movement as KM
from qcc.backends.c.lower import (
    MAX_RANK,
    UNPACKED,
    Arg,
    Call,
    Lowering,
    NumericMode,
    Ptr,
    c_identifier,
    is_index,
    numel,
    static_shape,
)
from qcc.backends.c.memory import Layout, direct_writes, layout
from qcc.backends.c.modes import numeric_mode

from qcc import __version__
from qcc.ir.core import Model, Node, Value


@attrs.frozen
class Generated:
    """The sources plus what the bench and the tests read back (sizes, the plan)."""

    files: dict[str, str]
    name: str
    mode: str
    layout: Layout
    arena_bytes: int
    float_islands: tuple[dict[str, str], ...] = ()
    """Nodes an integer mode computes in float32 between its stored tensors (report lines)."""
    notes: tuple[str, ...] = ()
    """How 4-bit weights are stored (report line)."""


def file_names(name: str) -> list[str]:
    """The files of the output directory for model `name`: sources, build products, qcc's marker."""
    from qcc.outputs import MARKER

    ident = c_identifier(name).lower()
    return [f"{ident}.h", f"{ident}.c", "main.c", "Makefile", "main.o", f"{ident}.o", "model", MARKER]


def generate(model: Model, name: str, isa: str = "portable", weights4: str = "packed",
             unpack_bytes: int = 2048) -> Generated:
    """All sources for one model; raises UnsupportedError before producing anything partial.

    `isa` "dot8" writes the affine dot products as uint8 x int8 (one vpdpbusd / SDOT per four
    products where the CPU has one); without such an instruction compilers widen both operands
    per product, so the portable default keeps int16 products of inputs widened once. `weights4`
    "packed" stores 4-bit weights two a byte, unpacked into the arena's tail (at most
    `unpack_bytes` of them, a slice of a layer's output channels, at a time) before they are used;
    "int8" stores one a byte."""
    ident = c_identifier(name).lower()
    lw = Lowering(model, numeric_mode(model), dot8=isa == "dot8", pack4=weights4 == "packed",
                  unpack_limit=unpack_bytes)
    stored = [*model.graph.inputs, *(v for n in model.graph.nodes for v in n.outputs)]
    align = max(lw.ctype(v).size for v in stored) if stored else 4

    def nbytes(value: Value) -> int:
        return lw.ctype(value).size * numel(value)

    lay = layout(model, lw.steps, nbytes, align)
    body = _run_body(model, lw, lay, nbytes)
    lw.kernels.prune("\n".join(body))
    arena_ctype = f"int{8 * align}_t" if lw.mode.integer else "float"
    tail = -(-lay.plan.total // align) * align  # the unpacked 4-bit weights of one layer, after the plan
    arena = tail + lw.unpack_bytes if lw.unpack_bytes else lay.plan.total
    unpacked = [f"#define {UNPACKED} ((int8_t *)(void *)(a + {tail}))", ""] if lw.unpack_bytes else []
    files = {
        f"{ident}.h": _header(model, lw, ident, lay, arena_ctype, align, arena),
        f"{ident}.c": _source(model, lw, ident, body, unpacked),
        "main.c": MAIN.replace("NAME", ident).replace("UPPER", ident.upper()),
        "Makefile": MAKEFILE.replace("NAME", ident),
    }
    islands = tuple({"node": s.node.name, "op": s.node.op, "reason": f"computed in float32 between "
                     f"{lw.mode.name} tensors (dequantized, float32 kernel, quantized)"}
                    for s in lw.steps if lw.mode.computes_in_float(s.node))
    return Generated(files, ident, lw.mode.name, lay, arena, islands, _weights4_notes(lw))


def _weights4_notes(lw: Lowering) -> tuple[str, ...]:
    if not lw.weights4:
        return ()
    count, stored = sum(c for c, _ in lw.weights4), sum(b for _, b in lw.weights4)
    if lw.pack4:
        return (f"{count} 4-bit weights of {len(lw.weights4)} layers stored two a byte ({stored} bytes; int8 "
                f"would take {count}); unpacked {lw.unpack_bytes} bytes at most at a time (option unpack_bytes: a "
                "slice of a layer's output channels) at the arena's end before they are used",)
    return (f"{count} 4-bit weights of {len(lw.weights4)} layers stored one a byte as int8 ({stored} bytes; "
            "option weights4=packed halves that, for an arena larger by up to unpack_bytes)",)


def _run_body(model: Model, lw: Lowering, lay: Layout, nbytes: Callable[[Value], int]) -> list[str]:
    redirect = direct_writes(model.graph, lw.steps, lay, nbytes)

    def resolve(arg: Arg, node: Node | None) -> str:
        if isinstance(arg, str):
            return arg
        if arg.plus:
            return f"({resolve(Ptr(arg.value), node)} + {arg.plus})"
        value = arg.value
        target = redirect.get(id(value))
        if target is not None:
            return f"(({lw.ctype(value).name} *)(void *)(a + {lay.offset(target.value)} + {target.byte}))"
        offset = lay.offset(value)
        if offset is None:  # a view of a constant
            assert node is not None
            return lw.const(lay.roots[id(value)], node)
        return f"(({lw.ctype(value).name} *)(void *)(a + {offset}))"

    anchor = model.graph.nodes[0] if model.graph.nodes else None

    def call(c: Call, node: Node | None = anchor) -> str:
        return f"    {c.fn}({', '.join(resolve(a, node) for a in c.args)});"

    def transfer(values: list[Value], inbound: bool) -> list[str]:
        """Graph inputs quantized (or copied) into the arena; outputs dequantized (copied) out."""
        out_lines, offset = [], 0
        for value in values:
            n = numel(value)
            flat, name, stored = f"{'in' if inbound else 'out'} + {offset}", comment_text(value.name), \
                value.quant or "float32"
            out_lines.append(f"    /* input {name}: {value.type} -> {stored} */" if inbound else
                             f"    /* output {name}: {stored} -> float32 */")
            transfer = (KM.indices_out(lw.kernels), []) if is_index(value) else \
                lw.mode.transfer(lw.kernels, value, inbound)
            if transfer is not None:
                ends: tuple[Arg, Arg] = (flat, Ptr(value)) if inbound else (Ptr(value), flat)
                fn, scaling = transfer
                out_lines.append(call(Call(fn, (*ends, str(n), *scaling))))
            else:
                here = resolve(Ptr(value), anchor)
                dst, src = (here, flat) if inbound else (flat, here)
                out_lines.append(f"    memcpy({dst}, {src}, {n} * sizeof(float));")
            offset += n
        return out_lines

    lines = transfer(model.graph.inputs, inbound=True)
    for step in lw.steps:
        node = step.node
        if step.alias and node.outputs and getattr(redirect.get(id(node.input(0))), "value", None) is node.outputs[0]:
            lines.append(f"    /* {comment_text(node.name)} ({node.op}): computed by the kernel of "
                         f"{comment_text(node.input(0).name)} into its own buffer */")
            continue
        if step.alias and id(node.outputs[0]) in lay.copies:
            out, src = node.outputs[0], node.input(0)
            lines.append(f"    /* {comment_text(node.name)} ({node.op}): a copy, the memory plan gave it its own buffer */")
            lines.append(f"    memcpy({resolve(Ptr(out), node)}, {resolve(Ptr(src), node)}, "
                         f"{numel(out)} * sizeof({lw.ctype(out).name}));")
            continue
        if step.alias:
            what = "computed by the kernel of" if step.fused else "view of"
            lines.append(f"    /* {comment_text(node.name)} ({node.op}): {what} {comment_text(node.input(0).name)} */")
            continue
        lines.append(f"    /* {comment_text(node.name)} ({node.op}) -> {node.outputs[0].quant or 'float32'} */")
        for c in step.calls:
            written = c.args[0].value if node.op == "Concat" and isinstance(c.args[0], Ptr) else None
            if written is not None and id(written) in redirect:
                lines.append(f"    /* {comment_text(written.name)}: written in place by its producer */")
            else:
                lines.append(call(c, node))
    lines += transfer(model.graph.outputs, inbound=False)
    return lines


def _tensor_macros(prefix: str, kind: str, values: list[Value], mode: NumericMode) -> list[str]:
    out = []
    for i, value in enumerate(values):
        shape = static_shape(value)
        key = f"{prefix}_{kind}{i}"
        out += [
            f"#define {key}_NAME {string_literal(value.name)}",
            f"#define {key}_SIZE {numel(value)}",
            f"#define {key}_RANK {len(shape)}",
            f"#define {key}_SHAPE {{{', '.join(map(str, shape))}}}",
            *([f'#define {key}_TYPE "int64 element indices (written as float)"'] if is_index(value)
              else mode.tensor_macros(key, value)),
        ]
    return out


def _header(model: Model, lw: Lowering, ident: str, lay: Layout, arena_ctype: str, align: int, arena: int) -> str:
    up = ident.upper()
    graph = model.graph
    ins, outs = graph.inputs, graph.outputs
    lines = [
        f"/* {ident}.h: generated by qcc {__version__} (target c) from model \"{comment_text(graph.name)}\". Do not edit.",
        f" * Numeric mode: {lw.mode.title}.",
        " * `in` holds every input and `out` every output as float32, one after another in the order",
        " * below; integer models quantize `in` (round half to even, saturate) and dequantize `out`.",
        " * Symbolic dimensions are bound to 1: one sample per call.",
        f" * {ident}_run uses a static arena (not reentrant); {ident}_run_with_arena takes the caller's,",
        f" * {up}_ARENA_SIZE bytes aligned to {up}_ARENA_ALIGN (e.g. an array of {ident}_arena_t).",
        " * Both return 0, or an error code. No heap, no recursion. */",
        f"#ifndef {up}_H_",
        f"#define {up}_H_",
        "",
        "#include <stdint.h>",
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
        f"#define {up}_OK 0",
        f"#define {up}_ERR_ARENA 1 /* NULL or misaligned arena */",
        "",
        f"#define {up}_NUM_INPUTS {len(ins)}",
        f"#define {up}_NUM_OUTPUTS {len(outs)}",
        f"#define {up}_IN_SIZE {sum(numel(v) for v in ins)} /* floats in `in` */",
        f"#define {up}_OUT_SIZE {sum(numel(v) for v in outs)} /* floats in `out` */",
        *_tensor_macros(up, "INPUT", ins, lw.mode),
        *_tensor_macros(up, "OUTPUT", outs, lw.mode),
        "",
        f"typedef {arena_ctype} {ident}_arena_t;",
        f"#define {up}_ARENA_SIZE {max(arena, 1)} /* bytes; planned by {lay.source}, lower bound "
        f"{lay.plan.lower_bound}, no reuse {lay.naive}"
        + (f"; then {lw.unpack_bytes} for one layer's unpacked 4-bit weights" if lw.unpack_bytes else "") + " */",
        f"#define {up}_ARENA_ALIGN {align}",
        "",
        f"int {ident}_run(const float *in, float *out);",
        f"int {ident}_run_with_arena(const float *in, float *out, void *arena);",
        "",
        "#ifdef __cplusplus",
        "}",
        "#endif",
        "",
        f"#endif /* {up}_H_ */",
        "",
    ]
    return "\n".join(lines)


def _source(model: Model, lw: Lowering, ident: str, body: list[str], unpacked: list[str]) -> str:
    up = ident.upper()
    head = [
        f"/* {ident}.c: generated by qcc {__version__} (target c) from model \"{comment_text(model.graph.name)}\". "
        "Do not edit. */",
        "#include <stddef.h>",
        "#include <stdint.h>",
        "#include <string.h>",
    ]
    if lw.kernels.uses_math:
        head.append("#include <math.h>")
    if lw.mode.integer:
        head += ["#include <float.h>", "", "#if FLT_EVAL_METHOD != 0",
                 '#error "bit-exact integer code needs float arithmetic in float (FLT_EVAL_METHOD == 0)"',
                 "#endif", "#ifdef __FAST_MATH__",
                 '#error "bit-exact integer code needs float arithmetic as written (no -ffast-math)"', "#endif"]
    head += ["", f'#include "{ident}.h"', "", f"#define QCC_MAX_RANK {MAX_RANK}", "", *unpacked]
    run = [
        f"int {ident}_run_with_arena(const float *in, float *out, void *arena)",
        "{",
        "    unsigned char *a = (unsigned char *)arena;",
        f"    if (a == NULL || (uintptr_t)a % {up}_ARENA_ALIGN != 0) {{",
        f"        return {up}_ERR_ARENA;",
        "    }",
        *body,
        f"    return {up}_OK;",
        "}",
        "",
        f"static {ident}_arena_t qcc_arena[({up}_ARENA_SIZE + sizeof({ident}_arena_t) - 1) / sizeof({ident}_arena_t)];",
        "",
        f"int {ident}_run(const float *in, float *out)",
        "{",
        f"    return {ident}_run_with_arena(in, out, qcc_arena);",
        "}",
        "",
    ]
    kernels = lw.kernels.source()
    return "\n".join(head) + kernels + "\n" + "\n".join(lw.defs) + "\n" + "\n".join(run)


MAIN = r"""/* main.c: generated by qcc (target c). Example program:
 *   ./model INPUT.bin OUTPUT.bin [REPEATS]
 * reads UPPER_IN_SIZE little-endian float32 values (all inputs, one after another), runs the model
 * and writes UPPER_OUT_SIZE float32 values (all outputs). With REPEATS it runs that many times and
 * prints the mean CPU time per inference to stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "NAME.h"

static float input[UPPER_IN_SIZE];
static float output[UPPER_OUT_SIZE];

static void swap_if_big_endian(float *data, long n)
{
    const unsigned int one = 1;
    long i;
    if (*(const unsigned char *)&one == 1) {
        return;
    }
    for (i = 0; i < n; ++i) {
        unsigned char *b = (unsigned char *)&data[i];
        unsigned char t = b[0];
        b[0] = b[3];
        b[3] = t;
        t = b[1];
        b[1] = b[2];
        b[2] = t;
    }
}

int main(int argc, char **argv)
{
    FILE *f;
    long repeats = 1;
    long i;
    clock_t start;
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: %s INPUT.bin OUTPUT.bin [REPEATS]\n", argv[0]);
        return 2;
    }
    if (argc == 4) {
        repeats = strtol(argv[3], NULL, 10);
        if (repeats < 1) {
            fprintf(stderr, "%s: REPEATS must be a positive integer\n", argv[0]);
            return 2;
        }
    }
    f = fopen(argv[1], "rb");
    if (f == NULL) {
        perror(argv[1]);
        return 1;
    }
    if (fread(input, sizeof(float), UPPER_IN_SIZE, f) != UPPER_IN_SIZE || fgetc(f) != EOF) {
        fprintf(stderr, "%s: expected exactly %d float32 values\n", argv[1], UPPER_IN_SIZE);
        fclose(f);
        return 1;
    }
    fclose(f);
    swap_if_big_endian(input, UPPER_IN_SIZE);
    start = clock();
    for (i = 0; i < repeats; ++i) {
        if (NAME_run(input, output) != UPPER_OK) {
            fprintf(stderr, "NAME_run failed\n");
            return 1;
        }
    }
    if (argc == 4) {
        fprintf(stderr, "%.3f us per inference\n",
                1e6 * (double)(clock() - start) / CLOCKS_PER_SEC / (double)repeats);
    }
    swap_if_big_endian(output, UPPER_OUT_SIZE);
    f = fopen(argv[2], "wb");
    if (f == NULL) {
        perror(argv[2]);
        return 1;
    }
    if (fwrite(output, sizeof(float), UPPER_OUT_SIZE, f) != UPPER_OUT_SIZE) {
        perror(argv[2]);
        fclose(f);
        return 1;
    }
    return fclose(f) == 0 ? 0 : 1;
}
"""

MAKEFILE = """# Generated by qcc (target c): `make` builds ./model (see main.c).
# The default flags are portable: C99, no instruction-set flags. ARCH_FLAGS adds the target's, e.g.
#   make ARCH_FLAGS="-O3 -march=native"        (this machine)
#   make CC=arm-none-eabi-gcc ARCH_FLAGS="-mcpu=cortex-m7 -mfpu=fpv5-d16 -mfloat-abi=hard"
# The kernels' inner loops have fixed lengths so that -O3 vectorizes them for whatever the flags
# allow; float models fuse multiply-adds when the target has a fast fmaf (FP_FAST_FMAF).
# -ffp-contract=off keeps every other float operation exactly as written (bit-exact integer models).
CC ?= cc
OPT ?= -O3
ARCH_FLAGS ?=
CFLAGS ?= -std=c99 $(OPT) -Wall -Wextra -pedantic -ffp-contract=off $(ARCH_FLAGS)
LDLIBS = -lm

model: main.o NAME.o
\t$(CC) $(CFLAGS) $(LDFLAGS) -o $@ main.o NAME.o $(LDLIBS)

main.o: main.c NAME.h
NAME.o: NAME.c NAME.h

clean:
\trm -f model main.o NAME.o

.PHONY: clean
"""
