"""A seeded slice of the mutation campaign (bench/fuzz.py) for every reader qcc has, and for the
generated cases of issue 20's classes (external references, HDF5, special files, element types,
bombs, output paths).

Each case is a truncated, bit-flipped, spliced or structurally edited model/data file read in a
worker process with a time limit and a memory cap; every case must end in success or a clean
QccError, and no reader may write a file anywhere (zip-slip members included). The full campaign
(10,000+ cases per reader) and its results are in docs/benchmarks.md.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SEED = 2026
CASES = {"onnx": 300, "npz": 150, "nnp": 150, "nnb": 300, "yaml": 250,
         # issue 20's classes (bench/fuzz_classes.py): generated, each case a folder
         "external": 150, "hdf5": 60, "special": 100, "dtype": 300, "bomb": 24, "outputs": 60}
ALWAYS_REFUSED = ("special", "bomb")  # no case of theirs is a readable input


def _fuzz() -> ModuleType:
    spec = importlib.util.spec_from_file_location("qcc_bench_fuzz", ROOT / "bench" / "fuzz.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


fuzz = _fuzz()


@pytest.mark.parametrize("reader", sorted(CASES))
def test_reader_survives_mutated_input(reader: str) -> None:
    result = fuzz.run_campaign(reader, CASES[reader], SEED, timeout=20.0, workers=2, memory_mb=2048, verbose=False)
    counts = result["counts"]
    assert result["findings"] == [], result["findings"][:5]
    assert all(counts[outcome] == 0 for outcome in fuzz.BAD), counts  # crash, hang, unnamed, wrong, outside, lost
    assert result["escaped_files"] == []
    assert counts["ok"] + counts["clean"] == CASES[reader]
    # the cases reach both outcomes: some files stay readable, most are refused
    assert counts["clean"] > CASES[reader] // 3 and (counts["ok"] > 0 or reader in ALWAYS_REFUSED), counts


def test_cases_are_reproducible_one_by_one() -> None:
    seeds = fuzz.yaml_seeds()
    first = [fuzz.make_case("yaml", seeds, SEED, i) for i in range(20)]
    again = [fuzz.make_case("yaml", seeds, SEED, i) for i in reversed(range(20))][::-1]
    assert first == again
    assert len(set(first)) > 15
    assert [fuzz.make_case("yaml", seeds, SEED + 1, i) for i in range(20)] != first
