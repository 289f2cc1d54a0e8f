"""NNabla .nnp conventions shared by the .nnp reader and the nnabla writers (.nnp, .nnb).

The frontend imports an .nnp into qcc's IR; the .nnp backend and nnb's byte-compatible
`--plan nnabla` writer go the other way. What both directions must agree on lives here, so no
backend imports a frontend: the marker of nodes the importer added, the network the model came
from, and how nnabla's pooling geometry maps to the IR's.
"""

from __future__ import annotations

from typing import Any

import attrs

from qcc.formats.nnp_archive import NnpContents

INTERNAL = "nnp.internal"
"""`meta` key of nodes and values the importer added (not nnabla functions/variables of the file)."""


@attrs.frozen(eq=False)
class NnpSource:
    """The .nnp's own network, executor and parameters as read (a model product).

    Left on the model by the .nnp frontend for writers that reproduce nnabla's converter byte for
    byte (`--target nnb{plan=nnabla}`): they write the file's network, not qcc's graph, so they
    need it as read, not re-read from disk. Immutable: copies of the model share it.
    """

    contents: NnpContents
    network: str
    executor: str | None

    def __deepcopy__(self, memo: dict[int, Any]) -> NnpSource:
        return self


def nnabla_pool_size(size: int, kernel: int, stride: int, pad: int, ignore_border: bool) -> int:
    """nnabla's pooled length (ignore_border=False: every window that starts on a real element)."""
    if ignore_border:
        return (size + 2 * pad - kernel) // stride + 1
    return (size + pad - 1) // stride + 1


def pool_geometry(op: str, attrs: dict[str, Any], hw: tuple[int, int],
                  ignore_border: bool, pad: list[int]) -> dict[str, Any] | None:
    """IR pads/ceil_mode reproducing nnabla pooling with symmetric `pad` (None: not expressible).

    With ignore_border=False nnabla runs windows past the end; padding there counts like the
    declared pad for Max/Sum/exclusive Avg, so a larger end pad is exact. Inclusive Avg counts
    only up to the declared pad, which is IR ceil_mode's overhang rule when the counts agree.
    """
    if ignore_border:
        return {"pads": pad + pad, "ceil_mode": False}
    kernel, strides = attrs["kernel"], attrs["strides"]
    outs = [nnabla_pool_size(hw[i], kernel[i], strides[i], pad[i], False) for i in range(2)]
    ends = [max(0, (outs[i] - 1) * strides[i] + kernel[i] - hw[i] - pad[i]) for i in range(2)]
    if op != "AvgPool" or not attrs.get("count_include_pad") or all(e <= p for e, p in zip(ends, pad)):
        return {"pads": pad + ends, "ceil_mode": False}
    from qcc.ir.ops._common import spatial_out

    try:
        ceil = [spatial_out(hw[i], kernel[i], strides[i], pad[i], pad[i], 1, True) for i in range(2)]
    except ValueError:
        return None
    return {"pads": pad + pad, "ceil_mode": True} if ceil == outs else None




def nnabla_pooling(op: str, attrs: dict[str, Any], hw: tuple[int, int]) -> tuple[bool, list[int]] | None:
    """(ignore_border, pad) of the nnabla pooling that computes the IR pool, None when none does.

    Symmetric pads are ignore_border=True. Otherwise ignore_border=False with the begin pads,
    whose windows run past the end (TensorFlow's SAME pads [0, 0, 1, 1] complete the last window
    this way): for Max, Sum and exclusive Avg the end padding never counts (-inf, 0, not counted),
    so equal window counts make equal results; inclusive Avg needs `pool_geometry`'s exact match.
    """
    from qcc.ir.ops._common import spatial_out

    pads, ceil_mode = [int(p) for p in attrs["pads"]], bool(attrs["ceil_mode"])
    begin = pads[:2]
    if pads == begin + begin and not ceil_mode:
        return True, begin
    kernel = [int(k) for k in attrs["kernel"]]
    strides = [int(s) for s in (attrs["strides"] or [1, 1])]
    if op == "AvgPool" and attrs.get("count_include_pad"):
        geometry = pool_geometry(op, {**attrs, "strides": strides}, hw, False, begin)
        return (False, begin) if geometry == {"pads": pads, "ceil_mode": ceil_mode} else None
    outs = [spatial_out(hw[i], kernel[i], strides[i], pads[i], pads[2 + i], 1, ceil_mode) for i in range(2)]
    nnabla = [nnabla_pool_size(hw[i], kernel[i], strides[i], begin[i], False) for i in range(2)]
    return (False, begin) if outs == nnabla else None
