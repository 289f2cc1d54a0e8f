"""Seed 003's table for ResNet23: .nnb model size and footprint, the seed vs nnabla vs qcc.

    .venv/bin/python bench/seed003_table.py [--record docs/benchmarks.md]

The network is seed 003's ResNet23 (tests/nnabla_zoo.py) with random weights: CIFAR-10 cannot be
downloaded here, so sizes are measured and accuracy is not. Model size is the .nnb file;
footprint is the file (nnabla-c-runtime loads it whole) plus the activation buffers it mallocs.
Each row is written three ways: nnabla 1.39's converter (`nnabla_cli convert -b 1 --api 44 -d
nnb_3 -s settings.yaml`), qcc with the same settings and its own buffer plan, and qcc's own
quantization (`--quantize`, calibrated on random inputs). `--record` replaces (or appends) the
"Seed 003 table" section of a markdown file. Needs nnabla (for the .nnp and its converter).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qcc.backends.nnb.format import read_nnb  # noqa: E402

from bench.doc_section import replace_section  # noqa: E402
from qcc.driver import compile as qcc_compile  # noqa: E402

HEADING = "## Seed 003 table"
SEED = {"float": ("449.5 KB", "1.2 M"), "params": ("126.0 KB", "1.0 M"), "params+buffers": ("126.0 KB", "495.2 KB")}
LABELS = {"float": "float model", "params": "quantized parameters", "params+buffers": "quantized parameters and buffers"}


def _settings(template: Path, out: Path, row: str) -> None:
    """float: nothing; params: conv/affine weights FIXED8 (nnabla's automatic position);
    params+buffers: also every buffer FIXED16_12, the type seed 003 gives most buffers."""
    import yaml

    settings = yaml.safe_load(template.read_text())
    for name in settings["variables"]:
        if row != "float" and name.endswith("/W"):
            settings["variables"][name] = "FIXED8"
    if row == "params+buffers":
        params = _parameter_names(template.with_suffix(".nnp"))
        for name in settings["variables"]:
            if name not in params:
                settings["variables"][name] = "FIXED16_12"
    out.write_text(yaml.safe_dump(settings))


def _parameter_names(nnp: Path) -> set[str]:
    from qcc.formats.nnp_archive import read_nnp

    network = read_nnp(nnp).proto.network[0]
    return {v.name for v in network.variable if v.type == "Parameter"}


def _measure(path: Path) -> dict[str, int]:
    data = path.read_bytes()
    nnb = read_nnb(data, str(path))
    buffers = sum(nnb.buffers) * (4 if nnb.version == 2 else 1)
    return {"model": len(data), "buffers": buffers, "footprint": len(data) + buffers}


def run(work: Path) -> dict[str, dict[str, Any]]:
    from tests.nnabla_zoo import save_resnet23
    from tests.nnb_util import nnabla_cli

    nnp = work / "resnet23.nnp"
    save_resnet23(nnp)
    template = work / "resnet23.yaml"
    nnabla_cli(["nnb_template", "-b", "1", "--api", "44", str(nnp), str(template)])
    commands = []
    for row in SEED:
        _settings(template, work / f"{row}.yaml", row)
        commands.append(["convert", "-b", "1", "--api", "44", "-d", "nnb_3", "-s", str(work / f"{row}.yaml"),
                         str(nnp), str(work / f"{row}.nnabla.nnb")])
    nnabla_cli(*commands)
    calib = work / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).standard_normal((32, 3, 32, 32)).astype(np.float32))
    weights_only = "fold-bn,calibrate,assign-fixed-point{bits=8,activations=marked,rules=any}"
    own = {"float": [("qcc --quantize none", "none")],
           "params": [("qcc, weights FIXED8 only (BN folded)", weights_only)],
           "params+buffers": [("qcc --quantize fixed8", "fixed8"), ("qcc --quantize fixed16", "fixed16")]}
    results: dict[str, dict[str, Any]] = {}
    for row in SEED:
        entry: dict[str, Any] = {"nnabla": _measure(work / f"{row}.nnabla.nnb")}
        same = work / f"{row}.qcc-settings.nnb"
        qcc_compile(str(nnp), str(same), settings=str(work / f"{row}.yaml"))
        entry["qcc, same settings"] = _measure(same)
        compat = work / f"{row}.compat.nnb"
        qcc_compile(str(nnp), str(compat), settings=str(work / f"{row}.yaml"), plan="nnabla")
        entry["compat identical"] = compat.read_bytes() == (work / f"{row}.nnabla.nnb").read_bytes()
        for n, (label, how) in enumerate(own[row]):
            path = work / f"{row}.own{n}.nnb"
            if how in ("none", "fixed8", "fixed16"):
                qcc_compile(str(nnp), str(path), quantize=how, calib=str(calib) if how != "none" else None)
            else:
                qcc_compile(str(nnp), str(path), passes=how, calib=str(calib))
            entry[label] = _measure(path)
        results[row] = entry
    return results


def _kb(n: int) -> str:
    return f"{n / 1024:.1f} KB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.2f} MB"


def report(results: dict[str, dict[str, Any]]) -> str:
    lines = [HEADING, "",
             "`bench/seed003_table.py`: seed 003's ResNet23 (1x3x32x32 input, random weights) as .nnb "
             "version 3, API level 44. Model = .nnb file; buffers = activation memory the runtime "
             "mallocs; footprint = model + buffers. The seed's settings.yaml is not published, so "
             "\"quantized parameters\" is every convolution/affine weight FIXED8 (nnabla's automatic "
             "position) and \"... and buffers\" adds every buffer as FIXED16_12, the type the seed gives "
             "most buffers. Accuracy (the seed's last column: 0.81 / 0.81 / 0.79 on CIFAR-10) is not "
             "measured: CIFAR-10 cannot be downloaded here and the weights are random.", "",
             "| row | seed model / footprint | writer | model | buffers | footprint |",
             "|---|---|---|---:|---:|---:|"]
    for row, entry in results.items():
        seed = " / ".join(SEED[row])
        for writer, m in entry.items():
            if writer == "compat identical":
                continue
            lines.append(f"| {LABELS[row]} | {seed} | {writer} | {_kb(m['model'])} | {_kb(m['buffers'])} | "
                         f"{_kb(m['footprint'])} |")
    same = all(e["compat identical"] for e in results.values())
    lines += ["", f"`--plan nnabla` output byte-identical to nnabla's converter for all three settings: {same}.",
              "nnabla's files for the two quantized rows mix FIXED8 weights with FLOAT32 or FIXED16 "
              "activations in Convolution, which nnabla-c-runtime's kernels read as one type (garbage "
              "results, see docs/nnb-runtime-semantics.md); qcc's files with the same settings compute "
              "correctly: float convolutions read their FIXED8 weights through a converted float copy "
              "(one extra buffer), FIXED16 convolutions get their FIXED8 weights widened to 16 bits in the "
              "file (a larger model). BatchNorm stays a separate function in the settings rows (nnabla "
              "does not fold it); `--quantize` folds it into the convolutions.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        section = report(run(Path(work)))
    print(section)
    if args.record:
        replace_section(HEADING, section, args.record)


if __name__ == "__main__":
    main()
