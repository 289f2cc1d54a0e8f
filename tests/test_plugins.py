"""Plugins and the public pass API: entry-point discovery, broken plugins, ordering contracts.

The example plugin (examples/plugin) is installed with pip into a fresh virtual environment that
reuses this one's packages, and driven through the `qcc` command there; broken plugins are fake
distributions (a dist-info directory with entry_points.txt) on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import textwrap
import venv
from collections.abc import Iterator
from pathlib import Path

import attrs
import numpy as np
import pytest

import qcc
from qcc import cli, testing
from qcc.builtin_plugin import BUILTINS
from qcc.plugins import Plugin, PluginError

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_SRC = ROOT / "examples" / "plugin"
HEAVY = ("onnx", "onnxruntime", "nnabla", "torch")
BUILTIN_PASSES = tuple(sorted(BUILTINS.passes))


# ---------------------------------------------------------------------- helpers
def _env(pythonpath: Path | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "QCC_DISABLE_PLUGIN_AUTOLOAD")}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    env.update(extra or {})
    return env


def run_qcc(*args: str, python: str | Path = sys.executable, pythonpath: Path | None = None,
            cwd: Path | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-m", "qcc", *args], capture_output=True, text=True,
                          env=_env(pythonpath, extra), cwd=cwd, timeout=300)


def fake_distribution(root: Path, dist: str, module: str, source: str, entry: str = "PLUGIN",
                      version: str = "1.0", ep_name: str = "main") -> Path:
    """A minimal installed distribution: <dist>-<version>.dist-info plus a module, under root."""
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[qcc.plugins]\n{ep_name} = {module}:{entry}\n")
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    return root


def one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def hard_activation_model() -> qcc.Model:
    """torch's decomposed hard-swish, then a hard-sigmoid with offset 1.5 (7 nodes)."""
    def build(graph: qcc.Graph, x: qcc.Value) -> qcc.Value:
        clipped = graph.add("Clip", graph.add("Add", x, testing.constant(graph, 3.0, "three")), min=0.0, max=6.0)
        hswish = graph.add("Div", graph.add("Mul", x, clipped), testing.constant(graph, 6.0, "six"), name="hswish")
        shifted = graph.add("Add", testing.constant(graph, 1.5, "offset"), hswish)
        gate = graph.add("Clip", shifted, min=0.0, max=6.0)
        return graph.add("Mul", gate, testing.constant(graph, 1.0 / 6.0, "sixth"), name="gate")

    return testing.make_model({"x": ("N", 16)}, build, name="hardact")


def reference(x: np.ndarray) -> np.ndarray:
    """What the model computes, in float64: hardsigmoid(hardswish(x) + 1.5 with m=6)."""
    x = x.astype(np.float64)
    hswish = x * np.clip(x + 3, 0, 6) / 6
    return np.clip(hswish + 1.5, 0, 6) / 6


def onnx_ops(path: Path) -> list[str]:
    import onnx

    return sorted(n.op_type for n in onnx.load(str(path)).graph.node)


def ort_run(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x})[0])


# ---------------------------------------------------------------------- the public API
def test_import_and_help_load_no_ml_framework() -> None:
    code = textwrap.dedent(f"""
        import sys
        import qcc
        assert [m for m in sys.modules if m.startswith("qcc")] == ["qcc"], sorted(sys.modules)
        from qcc.cli import main
        try:
            main(["--help"])
        except SystemExit:
            pass
        qcc.PassManager, qcc.Pass, qcc.Graph, qcc.ir.match_chains, qcc.testing.check_pass, qcc.compile
        assert main(["passes"]) == 0
        print(sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage: qcc" in proc.stdout and "--no-plugins" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_public_names_resolve_lazily_and_match_their_modules() -> None:
    import qcc.ir
    from qcc.driver import compile as driver_compile
    from qcc.pm.manager import PassManager

    for name in qcc.__all__:
        assert getattr(qcc, name) is not None, name
        assert name in dir(qcc)
    assert qcc.compile is driver_compile and qcc.PassManager is PassManager
    for name in ("Graph", "Model", "Node", "Value", "TensorType", "insert_after", "replace_node",
                 "remove_node", "match_chains", "print_model", "parse_model", "verify_model"):
        assert getattr(qcc, name) is getattr(qcc.ir, name)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        qcc.nope  # noqa: B018


def test_write_picks_the_backend_and_run_matches_onnxruntime(tmp_path: Path) -> None:
    model = hard_activation_model()
    x = testing.random_feeds(model, batch=3, low=-9, high=9)["x"]
    backend = qcc.write(model, tmp_path / "m.onnx")
    assert backend.name == "onnx"
    assert qcc.write(model, tmp_path / "m.bin", target="onnx").name == "onnx"
    with pytest.raises(qcc.UsageError, match=r"m\.xyz: cannot tell the target"):
        qcc.write(model, tmp_path / "m.xyz")
    assert not (tmp_path / "m.xyz").exists()
    ours = qcc.run(model, {"x": x})["gate"]
    np.testing.assert_allclose(ours, reference(x), atol=1e-6)
    np.testing.assert_allclose(ort_run(tmp_path / "m.onnx", x), ours, atol=1e-6)
    np.testing.assert_allclose(qcc.run(qcc.load(tmp_path / "m.bin", frontend="onnx"), {"x": x})["gate"], ours, atol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.bin", "m.onnx"]  # no temp files left


# ---------------------------------------------------------------------- the example plugin, installed
@pytest.fixture(scope="module")
def plugin_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with qcc-hardact pip-installed, reusing this environment's packages (offline).

    `--system-site-packages` from a venv's python exposes the *base* interpreter's packages, so a
    .pth also adds this environment's site-packages (heavy deps, pip, setuptools, and the
    editable qcc) with site.addsitedir, which processes the .pth files found there too.
    """
    root = tmp_path_factory.mktemp("plugin-venv")
    env_dir = root / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    target = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            capture_output=True, text=True, check=True, env=_env()).stdout.strip()
    (Path(target) / "zz_qcc_parent_env.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages()))
    source = root / "src"
    shutil.copytree(PLUGIN_SRC, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    pip = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                          "--disable-pip-version-check", "--quiet", str(source)],
                         capture_output=True, text=True, env=_env(extra={"PIP_NO_INPUT": "1"}), timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    # the console script pip would write for qcc itself, so `qcc` is a command in this venv
    script = env_dir / "bin" / "qcc"
    script.write_text(f"#!{python}\nimport sys\nfrom qcc.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    yield env_dir


def venv_qcc(env_dir: Path, *args: str, cwd: Path | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(env_dir / "bin" / "qcc"), *args], capture_output=True, text=True,
                          env=_env(extra=extra), cwd=cwd, timeout=300)


def test_installed_plugin_is_listed_with_its_options(plugin_venv: Path) -> None:
    plugins = venv_qcc(plugin_venv, "plugins")
    assert plugins.returncode == 0, plugins.stderr
    assert re.search(r"^qcc-hardact 0\.1\.0\n    pass:fuse-hard-activation$", plugins.stdout, re.M), plugins.stdout
    assert plugins.stdout.index("qcc (built-in)") < plugins.stdout.index("qcc-hardact")

    passes = venv_qcc(plugin_venv, "passes")
    assert passes.returncode == 0, passes.stderr
    block = passes.stdout[passes.stdout.index("fuse-hard-activation  [qcc-hardact]"):]
    lines = [line.strip() for line in block.splitlines()[1:5]]
    assert lines[0].startswith("Fuse Clip(x+b,0,m)/m into HardSigmoid")
    assert lines[1].startswith("max_value: float = 6.0")
    assert lines[2].startswith("hardswish: bool = True")
    assert lines[3].startswith("tolerance: float = 1e-06")
    for name in BUILTIN_PASSES:
        assert re.search(rf"^{name}  \[qcc \(built-in\)\]$", passes.stdout, re.M)

    for off in (venv_qcc(plugin_venv, "passes", "--no-plugins"),
                venv_qcc(plugin_venv, "passes", QCC_DISABLE_PLUGIN_AUTOLOAD="1")):
        assert off.returncode == 0 and "fuse-hard-activation" not in off.stdout and "dce  [" in off.stdout


def test_installed_plugin_runs_from_qcc_compile(plugin_venv: Path, tmp_path: Path) -> None:
    model = hard_activation_model()
    qcc.write(model, tmp_path / "in.onnx")
    x = testing.random_feeds(model, batch=5, low=-9, high=9)["x"]

    proc = venv_qcc(plugin_venv, "compile", "in.onnx", "-o", "out.onnx", "--passes", "fuse-hard-activation",
                    "--report", "report.json", "--dump-ir", "ir", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["pipeline"], report["nodes"]) == (["fuse-hard-activation"], 2)
    assert sorted(e["op"] for e in report["hard_activations"]) == ["HardSigmoid", "HardSwish"]
    source_ir = qcc.parse_model((tmp_path / "ir" / "00-input.qir").read_text())
    fused_ir = qcc.parse_model((tmp_path / "ir" / "01-fuse-hard-activation.qir").read_text())
    assert testing.op_counts(source_ir) == {"Add": 2, "Clip": 2, "Mul": 2, "Div": 1}
    assert testing.op_counts(fused_ir) == {"HardSwish": 1, "HardSigmoid": 1}
    assert [v.name for v in fused_ir.graph.outputs] == ["gate"] and fused_ir.graph.constants == []
    # opset 13 has no HardSwish: the writer spells it HardSigmoid + Mul, so 7 ONNX nodes become 3
    assert onnx_ops(tmp_path / "in.onnx") == ["Add", "Add", "Clip", "Clip", "Div", "Mul", "Mul"]
    assert onnx_ops(tmp_path / "out.onnx") == ["HardSigmoid", "HardSigmoid", "Mul"]
    fused = ort_run(tmp_path / "out.onnx", x)
    np.testing.assert_allclose(fused, ort_run(tmp_path / "in.onnx", x), atol=1e-6)
    np.testing.assert_allclose(fused, reference(x), atol=1e-6)
    assert np.ptp(fused) > 0.5  # the inputs reach both clamp knees: not a trivially flat output

    # the option changes what matches: no Clip with max 4 here, so nothing changes
    proc = venv_qcc(plugin_venv, "compile", "in.onnx", "-o", "same.onnx", "--passes",
                    "fuse-hard-activation{max_value=4}", "--report", "same.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "same.json").read_text())["nodes"] == 7
    assert onnx_ops(tmp_path / "same.onnx") == onnx_ops(tmp_path / "in.onnx")

    gone = venv_qcc(plugin_venv, "compile", "in.onnx", "-o", "x.onnx", "--passes", "fuse-hard-activation",
                    "--no-plugins", cwd=tmp_path)
    one_line_error(gone, "unknown pass 'fuse-hard-activation'", "dce")
    assert not (tmp_path / "x.onnx").exists()


def test_plugin_authors_tests_pass_in_the_venv(plugin_venv: Path, tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    shutil.copytree(PLUGIN_SRC / "tests", tests)
    proc = subprocess.run([str(plugin_venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tests)], capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"\b5 passed\b", proc.stdout), proc.stdout


# ---------------------------------------------------------------------- the same pass in-process
def test_example_pass_registered_in_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(PLUGIN_SRC))
    from qcc_hardact.fuse import FuseHardActivation

    model = hard_activation_model()
    feeds = testing.random_feeds(model, batch=4, low=-9, high=9)
    with testing.isolated_registry():
        assert qcc.register_pass(FuseHardActivation) is FuseHardActivation
        qcc.register_pass(FuseHardActivation)  # same class again: fine
        result = qcc.PassManager("fuse-hard-activation{hardswish=false}").run(testing.clone_model(model))
        assert result.modified and testing.op_counts(result.model) == {"HardSigmoid": 2, "Mul": 1}
        testing.assert_outputs_close(model, result.model, feeds)

        compiled, report = qcc.compile(testing.clone_model(model), tmp_path / "out.onnx",
                                       passes="fuse-hard-activation")
        assert testing.op_counts(compiled) == {"HardSwish": 1, "HardSigmoid": 1} and report["nodes"] == 2
        np.testing.assert_allclose(ort_run(tmp_path / "out.onnx", feeds["x"]), reference(feeds["x"]), atol=1e-6)

        @attrs.frozen
        class Impostor(qcc.Pass):
            """Claims a taken name."""

            name = "fuse-hard-activation"

        with pytest.raises(PluginError, match=r"provided by both qcc_hardact\.fuse \(in-process\) and"):
            qcc.register_pass(Impostor)
    with pytest.raises(qcc.UsageError, match="unknown pass 'fuse-hard-activation'"):
        qcc.PassManager("fuse-hard-activation")  # the registration did not leak


# ---------------------------------------------------------------------- broken plugins
GOOD_PASS = '''
    import attrs
    import qcc

    @attrs.frozen
    class Twin(qcc.Pass):
        """A pass two distributions both claim."""
        name = "twin"
        def run(self, model, ctx):
            return qcc.PassResult.unchanged(model)

    PLUGIN = qcc.Plugin(api_version=1, passes={"twin": lambda: Twin})
'''


@pytest.mark.parametrize("case", ["import-error", "duplicate", "duplicate-builtin", "api-version", "not-a-plugin"])
def test_broken_plugin_is_one_line_and_no_plugins_still_lists_builtins(tmp_path: Path, case: str) -> None:
    if case == "import-error":
        fake_distribution(tmp_path, "broken-plugin", "broken_plugin", "import qcc_dependency_that_is_not_there\n")
        needles = ["plugin 'main' (broken_plugin:PLUGIN) from distribution broken-plugin 1.0 failed to import",
                   "ModuleNotFoundError", "qcc_dependency_that_is_not_there"]
    elif case == "duplicate":
        fake_distribution(tmp_path, "twin-b", "twin_b", GOOD_PASS)
        fake_distribution(tmp_path, "twin-a", "twin_a", GOOD_PASS)
        needles = ["pass 'twin' is provided by both twin-a and twin-b"]  # sorted: a loads first
    elif case == "duplicate-builtin":
        fake_distribution(tmp_path, "shadow", "shadow", GOOD_PASS.replace('{"twin"', '{"dce"'))
        needles = ["pass 'dce' is provided by both qcc (built-in) and shadow"]
    elif case == "api-version":
        fake_distribution(tmp_path, "from-the-future", "future_plugin", "import qcc\nPLUGIN = qcc.Plugin(api_version=99)\n")
        needles = ["plugin from from-the-future targets qcc plugin API 99", "has API 1"]
    else:
        fake_distribution(tmp_path, "confused", "confused", "PLUGIN = {'passes': {}}\n")
        needles = ["plugin from confused is a dict, not qcc.Plugin"]
    for command in ("passes", "plugins"):
        line = one_line_error(run_qcc(command, pythonpath=tmp_path), "qcc: plugin error: ", *needles)
        assert "Traceback" not in line
    compile_error = run_qcc("compile", "m.onnx", "-o", "o.onnx", pythonpath=tmp_path)
    one_line_error(compile_error, *needles)
    if case != "import-error":  # switching plugins off never loads one: one kind of breakage shows it
        return
    for off in (run_qcc("passes", "--no-plugins", pythonpath=tmp_path),
                run_qcc("--no-plugins", "passes", pythonpath=tmp_path),
                run_qcc("passes", pythonpath=tmp_path, QCC_DISABLE_PLUGIN_AUTOLOAD="1")):
        assert off.returncode == 0, off.stderr
        assert [line.split()[0] for line in off.stdout.splitlines() if not line.startswith(" ")] == list(BUILTIN_PASSES)


def test_pass_that_fails_on_first_use_names_pass_and_distribution(tmp_path: Path) -> None:
    fake_distribution(tmp_path, "lazy-broken", "lazy_broken",
                      "import qcc\nPLUGIN = qcc.Plugin(api_version=1, passes={'ghost': 'lazy_broken_impl:Ghost'})\n")
    listed = run_qcc("plugins", pythonpath=tmp_path)  # listing imports nothing, so it still works
    assert listed.returncode == 0 and "lazy-broken 1.0\n    pass:ghost" in listed.stdout
    one_line_error(run_qcc("passes", pythonpath=tmp_path),
                   "pass 'ghost' from lazy-broken failed to load: ModuleNotFoundError", "lazy_broken_impl")


def test_discovery_order_is_by_distribution_then_entry_point(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("QCC_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    for i, dist in enumerate(["zeta-plugin", "alpha-plugin", "mid-plugin"]):
        module = dist.replace("-", "_")
        body = f"import qcc\nPLUGIN = qcc.Plugin(api_version=1, frontends={{'{module}': 'x:y'}})\n"
        fake_distribution(tmp_path / str(i), dist, module, body)
        monkeypatch.syspath_prepend(str(tmp_path / str(i)))
    with testing.isolated_registry(autoload=True) as reg:
        names = [d.name for d in reg.distributions if d.name.endswith("-plugin")]
        assert names == ["alpha-plugin", "mid-plugin", "zeta-plugin"]
        assert reg.distributions[0].name == "qcc (built-in)"
        assert reg.entry("frontend", "mid_plugin").distribution == "mid-plugin"


def test_plugin_api_version_is_required_and_checked() -> None:
    with pytest.raises(TypeError):
        Plugin(passes={})  # type: ignore[call-arg]
    with testing.isolated_registry():
        with pytest.raises(PluginError, match=r"targets qcc plugin API 2, this qcc .* has API 1"):
            qcc.plugins.register(Plugin(api_version=2), "next-gen")
        qcc.plugins.register(Plugin(api_version=qcc.PLUGIN_API_VERSION, passes={"p": "m:P"}), "ok-dist")
        assert ("pass", "p") in qcc.plugins.registry().entries


# ---------------------------------------------------------------------- ordering contracts
@attrs.frozen
class MarkA(qcc.Pass):
    """Does nothing but leave its name in the model's history."""

    name = "mark-a"

    def run(self, model: qcc.Model, ctx: qcc.PassContext) -> qcc.PassResult:
        return qcc.PassResult.unchanged(model)


@attrs.frozen
class NeedsA(MarkA):
    """Must come after mark-a."""

    name = "needs-a"
    requires = ("mark-a",)


class NeedyBackend:
    """A backend whose output only makes sense after mark-a."""

    name = "needy"
    extensions = (".needy",)
    output_is_directory = False
    requires = ("mark-a",)

    def write(self, model: qcc.Model, out: str, **options: object) -> None:
        from qcc.io import atomic_write_bytes

        atomic_write_bytes(out, qcc.print_model(model).encode())


@pytest.fixture
def ordering_registry() -> Iterator[None]:
    with testing.isolated_registry():
        qcc.plugins.register(Plugin(api_version=1, passes={"mark-a": lambda: MarkA, "needs-a": lambda: NeedsA},
                                    backends={"needy": NeedyBackend}), "ordering-test")
        yield


@pytest.mark.usefixtures("ordering_registry")
def test_pass_requirements_are_checked_not_fixed() -> None:
    model = hard_activation_model()
    with pytest.raises(qcc.UsageError, match="pass 'needs-a' requires 'mark-a' to run before it, but 'mark-a' runs after it"):
        qcc.PassManager("needs-a,mark-a").run(model)
    with pytest.raises(qcc.UsageError, match="'mark-a' is missing from the pipeline"):
        qcc.PassManager("needs-a").run(model)
    assert model.passes_run == []  # the check happens before anything runs
    assert qcc.PassManager("mark-a,needs-a").run(model).model.passes_run == ["mark-a", "needs-a"]
    qcc.PassManager("needs-a").run(model)  # mark-a already ran on this model: satisfied
    assert model.passes_run == ["mark-a", "needs-a", "needs-a"]


@pytest.mark.usefixtures("ordering_registry")
def test_backend_requirements_fail_naming_target_and_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = hard_activation_model()
    with pytest.raises(qcc.UsageError, match="target 'needy' requires pass 'mark-a', which is missing from the pipeline"):
        qcc.compile(testing.clone_model(model), tmp_path / "a.needy", passes="dce")
    with pytest.raises(qcc.UsageError, match="target 'needy' requires pass 'mark-a', which has not run on model 'hardact'"):
        qcc.write(model, tmp_path / "b.needy")
    assert not list(tmp_path.iterdir())

    qcc.write(model, tmp_path / "model.onnx")
    assert cli.main(["compile", str(tmp_path / "model.onnx"), "-o", str(tmp_path / "c.needy"), "--passes", "dce"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["qcc: usage error: target 'needy' requires pass 'mark-a', which is missing from the pipeline"]
    assert not (tmp_path / "c.needy").exists()

    compiled, _ = qcc.compile(testing.clone_model(model), tmp_path / "d.needy", passes="mark-a,dce")
    assert compiled.passes_run == ["mark-a", "dce"] and (tmp_path / "d.needy").exists()
    qcc.PassManager("mark-a").run(model)
    qcc.write(model, tmp_path / "e.needy")
    assert "mark-a" in (tmp_path / "e.needy").read_text()


# ---------------------------------------------------------------------- qcc passes, qcc.testing, docs
def test_passes_command_shows_types_defaults_requirements(capsys: pytest.CaptureFixture[str]) -> None:
    from typing import Literal

    @attrs.frozen
    class Knobs(qcc.Pass):
        """Has one option of each kind.

        More text that `qcc passes` does not show.
        """

        name = "knobs"
        requires = ("dce",)
        count: int
        method: Literal["minmax", "entropy"] = "minmax"
        after: tuple[str, ...] = ("Relu", "AvgPool")
        limit: float | None = None
        exact: bool = attrs.field(default=False, metadata={"help": "bit-exact mode"})

    with testing.isolated_registry():
        qcc.register_pass(Knobs)
        assert cli.main(["passes"]) == 0
        out = capsys.readouterr().out
        block = out[out.index("knobs  ["):].splitlines()
        assert block[1:8] == [
            "    Has one option of each kind.",
            "    count: int = (required)",
            "    method: minmax|entropy = 'minmax'",
            "    after: list[str] = ('Relu', 'AvgPool')",
            "    limit: float | none = None",
            "    exact: bool = False  (bit-exact mode)",
            "    requires: dce",
        ]
        spec = "dce,knobs{count=3,method=entropy,after=Conv|Dense,limit=none,exact=yes}"
        (_, knobs) = qcc.PassManager(spec).passes
        assert knobs == Knobs(count=3, method="entropy", after=("Conv", "Dense"), limit=None, exact=True)
        with pytest.raises(qcc.UsageError, match=re.escape("option knobs.method: 'fast' is not one of minmax|entropy")):
            qcc.PassManager("knobs{count=1,method=fast}")
        with pytest.raises(qcc.UsageError, match="pass 'knobs' has no option 'bits'"):
            qcc.PassManager("knobs{count=1,bits=8}")


def test_testing_helpers_catch_wrong_passes() -> None:
    @attrs.frozen
    class WrongRelu(qcc.Pass):
        """Replaces Clip(0, 6) by Relu: forgets the upper bound."""

        name = "wrong-relu"

        def run(self, model: qcc.Model, ctx: qcc.PassContext) -> qcc.PassResult:
            for node in [n for n in model.graph.nodes if n.op == "Clip"]:
                qcc.replace_node(model.graph, node, "Relu")
            return qcc.PassResult(model, True)

    @attrs.frozen
    class Crashes(qcc.Pass):
        """Has a bug."""

        name = "crashes"

        def run(self, model: qcc.Model, ctx: qcc.PassContext) -> qcc.PassResult:
            results: dict[str, qcc.PassResult] = {}
            return results["missing"]

    model = hard_activation_model()
    feeds = testing.random_feeds(model, low=-9, high=9)
    with pytest.raises(AssertionError, match=r"output 'gate' \(was 'gate'\) differs: max abs error"):
        testing.check_pass(model, WrongRelu(), feeds)
    with pytest.raises(qcc.InternalError, match="pass 'crashes' crashed: KeyError"):
        testing.run_pass(testing.clone_model(model), Crashes())
    with pytest.raises(AssertionError, match="pass reported modified=False, expected True"):
        testing.check_pass(model, MarkA())
    with pytest.raises(AssertionError, match=r"(?s)IR differs.*-  output %nope\n\+  output %gate"):
        testing.assert_ir(model, testing.ir_text(model).replace("output %gate", "output %nope"))
    testing.assert_ir(model, testing.ir_text(model))
    assert testing.op_counts(model) == {"Add": 2, "Clip": 2, "Mul": 2, "Div": 1}  # check_pass left it alone


def test_writing_a_pass_doc_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "docs" / "writing-a-pass.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert len(blocks) >= 10
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "writing_a_pass_doc"}
    with testing.isolated_registry():
        for index, block in enumerate(blocks):
            exec(compile(block, f"docs/writing-a-pass.md block {index}", "exec"), namespace)
    assert (tmp_path / "after.onnx").exists()
