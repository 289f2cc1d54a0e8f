"""Calibration statistics: what `calibrate` computes and the annotation passes read.

A cached analysis of the pass manager (`CalibrationStats`), not a product on the model: a pass
that changes the graph without preserving it drops the statistics, so annotations are never
chosen from the statistics of a graph that no longer exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from qcc.errors import UsageError
from qcc.ir.core import Model
from qcc.pm.base import Analysis, AnalysisManager
from qcc.quant.stats import TensorStats


@attrs.define(eq=False)
class Calibration:
    """Per-tensor statistics by value name, and how many samples produced them."""

    stats: dict[str, TensorStats] = attrs.field(factory=dict)
    samples: int = 0

    def get(self, name: str) -> TensorStats | None:
        return self.stats.get(name)

    def merge(self, other: Calibration) -> Calibration:
        """Both calibrations together; a tensor only one side saw keeps that side's statistics."""
        merged = dict(self.stats)
        for name, st in other.stats.items():
            merged[name] = merged[name].merge(st) if name in merged else st
        return Calibration(merged, self.samples + other.samples)

    def nbytes(self) -> int:
        return sum(s.nbytes() for s in self.stats.values())

    def to_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "stats": [s.to_dict() for s in self.stats.values()]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibration:
        stats = [TensorStats.from_dict(d) for d in data["stats"]]
        return cls({s.name: s for s in stats}, int(data["samples"]))


def pre_bias_key(name: str) -> str:
    """The statistics of layer output `name`'s sum before its bias (calibrate's `pre_bias` ops)."""
    return f"{name}#pre-bias"


class CalibrationStats(Analysis):
    """Per-tensor statistics of the float model on the calibration data (`calibrate` stores them:
    they need data, so asking for them without that pass is a usage error naming who asked)."""

    name = "calibration"

    def __init__(self, who: str = "") -> None:
        self.who = who

    def compute(self, model: Model, am: AnalysisManager) -> Any:
        raise UsageError(f"pass {self.who or 'this pass'!r} needs calibration statistics: run 'calibrate' before it "
                         "(with --calib DATA.npz), with no graph-changing pass in between")
