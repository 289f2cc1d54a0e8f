"""Issue 19 (items 3 and 4): calibration at a wider batch and on several workers, same statistics.

What "identical" means (docs/passes.md, "Calibration at scale"): with one engine, the statistics
(every histogram bin, count, min and max) are bit-identical whatever the batch size a static-batch
model is rebound to and whatever the number of workers or shards. qcc's interpreter guarantees it
by computing each sample's matrix products alone; sharding runs exactly the batches the single
process runs, merged exactly (TensorStats.merge). Between engines (qcc's numpy kernels and
onnxruntime's) the float values differ by rounding, and so may the statistics: the test below
bounds that difference by the arithmetic.
"""

from __future__ import annotations

import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qcc.passes.bias_correct import own_errors
from qcc.passes.calibrate import collect, collect_sharded

from qcc.driver import load
from qcc.errors import UsageError
from qcc.ir.core import Graph, Model, Value
from qcc.ir.rebatch import rebatched
from qcc.pm.parallel import Workers, worker_threads
from qcc.testing import constant, make_model
from tests.cli_util import one_error_line, qcc

SAMPLES = 13  # not a multiple of the rebound batch: the last samples run at the static batch


def static_batch_onnx(path: Path, channels: int = 8, size: int = 12) -> Path:
    """ResNet's tail as torch.onnx and the ONNX zoo export it: batch 1, a Reshape to the constant
    (1, C) before the classifier's Gemm (which numpy computes as a gemv for one row)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32), n)
             for n, s in (("w1", (channels, 3, 3, 3)), ("w2", (channels, channels, 3, 3)), ("fc", (10, channels)))]
    inits += [numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "b1"),
              numpy_helper.from_array(np.array([1, channels], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["s"]),
             helper.make_node("Relu", ["s"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
             helper.make_node("Reshape", ["p", "shape"], ["f"]),
             helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "tail", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return static_batch_onnx(tmp_path_factory.mktemp("scale") / "tail.onnx")


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(0).standard_normal((SAMPLES, 3, 12, 12)).astype(np.float32)}


def stats(model: Model, data: dict[str, np.ndarray], **kwargs: Any) -> dict[str, Any]:
    return collect(model, data, 1, **kwargs).to_dict()


def test_rebound_batch_gives_the_statistics_of_batch_one(model_file: Path, data: dict[str, np.ndarray]) -> None:
    model = load(str(model_file))
    wide = rebatched(model, 4)
    assert wide is not None and wide.graph.inputs[0].type.shape == (4, 3, 12, 12)
    assert wide.graph.outputs[0].type.shape == (4, 10)  # the Reshape to (1, 8) now keeps the batch
    one = stats(model, data)
    assert one["samples"] == SAMPLES
    assert stats(model, data, rebatch=4) == one  # 3 batches of 4, then 1 sample at batch 1
    assert stats(model, data, rebatch=16) == one  # fewer samples than the batch


def test_a_graph_that_mixes_samples_is_not_rebound() -> None:
    def build(g: Graph, x: Value) -> Value:
        moved = g.add("Transpose", x, perm=[1, 0, 2, 3])  # the batch leaves axis 0
        return g.add("Mul", moved, constant(g, 2.0))

    model = make_model({"x": (1, 3, 4, 4)}, build)
    assert rebatched(model, 4) is None
    data = {"x": np.random.default_rng(1).standard_normal((5, 3, 4, 4)).astype(np.float32)}
    assert stats(model, data, rebatch=4) == stats(model, data)  # calibrated at batch 1, as before


@pytest.mark.parametrize("engine", ["qcc", "onnxruntime"])
def test_sharded_statistics_are_identical(model_file: Path, data: dict[str, np.ndarray], engine: str) -> None:
    model = load(str(model_file))
    single = collect(model, data, 1, engine=engine, rebatch=4).to_dict()
    for workers in (Workers(2), Workers(3)):
        sharded = collect_sharded(model, data, 1, workers, engine=engine, rebatch=4).to_dict()
        assert sharded == single


def test_local_workers_take_several_shards_each(model_file: Path, data: dict[str, np.ndarray],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A forked pool hands shards out as its workers free up: each local worker gets several
    (contiguous, in sample order, all samples once), and the statistics stay the single process's."""
    from qcc.pm.parallel import BALANCE

    model = load(str(model_file))
    sizes: list[int] = []
    spread = Workers.map

    def spy(self: Workers, fn: Any, items: Any) -> Any:
        sizes.extend(len(item.feeds["x"]) for item in items)
        firsts = [item.feeds["x"][0] for item in items]
        starts = np.cumsum([0, *sizes[:-1]])
        assert all(np.array_equal(f, data["x"][a]) for f, a in zip(firsts, starts))
        return spread(self, fn, items)

    monkeypatch.setattr(Workers, "map", spy)
    sharded = collect_sharded(model, data, 1, Workers(2)).to_dict()
    assert len(sizes) == min(2 * BALANCE, SAMPLES) > 2 and sum(sizes) == SAMPLES
    assert sharded == collect(model, data, 1).to_dict()


def test_engines_agree_within_float_rounding(model_file: Path, data: dict[str, np.ndarray]) -> None:
    """numpy and onnxruntime sum the same products in different orders: each float32 result may
    differ by a few units in the last place of the sums involved (27-72 products, |terms| <= absmax),
    bounded here by 1e-5 of the tensor's range. A value that close to a bin edge may change bin, so
    the cumulative histograms may differ by the values in that band (a small fraction)."""
    model = load(str(model_file))
    ours = collect(model, data, 1, rebatch=4)
    theirs = collect(model, data, 1, engine="onnxruntime", rebatch=4)
    assert ours.samples == theirs.samples
    for name, a in ours.stats.items():
        b = theirs.stats[name]
        tol = 1e-5 * max(a.absmax, 1e-30)
        assert a.count == b.count and a.log2_extent == b.log2_extent, name
        assert abs(a.min - b.min) <= tol and abs(a.max - b.max) <= tol, name
        moved = np.abs(np.cumsum(a.hist) - np.cumsum(b.hist)).max()
        assert moved <= max(2, a.count // 1000), (name, moved)


def test_workers_write_the_same_bytes(model_file: Path, data: dict[str, np.ndarray], tmp_path: Path) -> None:
    calib = tmp_path / "calib.npz"
    np.savez(calib, **data)
    outputs = []
    for index, flags in enumerate((["--workers", "1"], ["--workers", "2"])):
        out = tmp_path / str(index)
        out.mkdir()
        proc = qcc("compile", str(model_file), "-o", str(out / "q.onnx"), "--quantize", "int8", "--calib", str(calib),
                   "-q", *flags)
        assert proc.returncode == 0, proc.stderr
        outputs.append((out / "q.onnx").read_bytes())
    assert outputs[0] == outputs[1]


def test_workers_without_calibration_are_refused(model_file: Path, tmp_path: Path) -> None:
    for flags in (["--workers", "2"], ["--cluster", "tcp://127.0.0.1:1"]):
        proc = qcc("compile", str(model_file), "-o", str(tmp_path / "f.onnx"), *flags)
        assert proc.returncode == 2
        assert f"{flags[0]} shards calibration" in one_error_line(proc)
    calib = tmp_path / "c.npz"
    np.savez(calib, x=np.zeros((2, 3, 12, 12), np.float32))
    proc = qcc("compile", str(model_file), "-o", str(tmp_path / "f.onnx"), "--quantize", "int8", "--calib",
               str(calib), "--workers", "0")
    assert proc.returncode == 2 and "--workers 0" in one_error_line(proc)
    assert not (tmp_path / "f.onnx").exists()


def test_a_stream_is_not_sharded(model_file: Path, tmp_path: Path) -> None:
    import qcc as api

    batches = [{"x": np.zeros((1, 3, 12, 12), np.float32)}] * 2
    with pytest.raises(UsageError, match="needs the data as arrays"):
        api.compile(str(model_file), tmp_path / "s.onnx", quantize="int8", calib=batches, workers=2)


def sensitivity_run(model_file: Path, data: dict[str, np.ndarray], out: Path, **kwargs: Any) -> tuple[Any, bytes]:
    import qcc as api

    _, report = api.compile(str(model_file), out, passes="calibrate,quantize-affine,sensitivity{samples=6,batch_size=2}",
                            calib=data, **kwargs)
    return report["sensitivity"], out.read_bytes()


def test_sharded_sensitivity_ranking_is_identical(model_file: Path, data: dict[str, np.ndarray], tmp_path: Path) -> None:
    single = sensitivity_run(model_file, data, tmp_path / "one.onnx")
    assert len(single[0]["layers"]) >= 4 and all(layer["sqnr_db"] for layer in single[0]["layers"])
    assert sensitivity_run(model_file, data, tmp_path / "two.onnx", workers=2) == single


def test_dask_cluster_gives_the_single_process_results(model_file: Path, data: dict[str, np.ndarray],
                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same statistics, shifts and ranking; the weights reach the workers once, however many
    shards and passes hold them (here every array of 1 KB or more travels apart: w2), through
    files the workers read (they share this machine). A file whose contents differ from its
    key is never used: the map runs again by scatter, with the same results."""
    distributed = pytest.importorskip("distributed")
    from qcc.pm import cluster as dask_jobs

    monkeypatch.setattr(dask_jobs, "SHARED_BYTES", 1024)
    model = load(str(model_file))
    weight = next(v.const for v in model.graph.constants if v.const is not None and v.const.nbytes >= 1024)
    single = collect(model, data, 1, rebatch=4).to_dict()
    ranking = sensitivity_run(model_file, data, tmp_path / "one.onnx")
    quantized = quantized_batches(model_file, data)
    shifts = own_errors(*quantized)
    halved = {"x": data["x"] * np.float32(0.5)}
    single_halved = collect(model, halved, 1, rebatch=4).to_dict()
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        try:
            workers = Workers(cluster=cluster.scheduler_address)
            assert workers.slots() == 2
            # the nanny allows each Dask thread one BLAS thread: a job's products run on one, as a
            # forked worker's do, not on every core beside the other workers
            assert workers.map(lambda _: worker_threads(), [0, 1]) == [1, 1] and worker_threads() is None
            assert collect_sharded(model, data, 1, workers, rebatch=4).to_dict() == single
            session = dask_jobs.session(cluster.scheduler_address)
            assert session.use_files and session.files is not None
            folder = session.files.folder
            assert session.sent_bytes == weight.nbytes  # both shards' weight, filed once
            assert len(list(folder.iterdir())) == 1  # the shards' data files are gone, the weight's kept
            sharded = own_errors(*quantized, workers)  # another model object, the same weight
            assert session.sent_bytes == weight.nbytes
            assert len(sharded) == 3 and all(np.array_equal(shifts[k], v) for k, v in sharded.items())
            assert sensitivity_run(model_file, data, tmp_path / "two.onnx", cluster=cluster.scheduler_address) == ranking

            put = dask_jobs._Files.put

            def tampered(self: Any, key: str, array: np.ndarray) -> str:
                path = put(self, key, array)
                with open(path, "r+b") as fh:  # the last element's bytes changed after the client wrote them
                    fh.seek(-4, os.SEEK_END)
                    fh.write(b"\x00\x00\x80\x7f")
                return path

            monkeypatch.setattr(dask_jobs._Files, "put", tampered)
            assert collect_sharded(model, halved, 1, workers, rebatch=4).to_dict() == single_halved
            assert session.use_files is False and session.files is None and not folder.exists()
            assert collect_sharded(model, data, 1, workers, rebatch=4).to_dict() == single  # by scatter now
        finally:
            dask_jobs.close_sessions()


def test_a_worker_reads_a_filed_array_only_with_its_contents(tmp_path: Path) -> None:
    """A filed array is checked against its key; a killed client's folder is removed by the next
    client (in /dev/shm it is memory until the machine restarts), a running one's is left alone."""
    from qcc.pm import cluster as dask_jobs

    ended = subprocess.Popen(["true"])
    ended.wait()
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    root = Path("/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir())
    orphan, alive = root / f"qcc-arrays-{ended.pid}-test", root / f"qcc-arrays-{running.pid}-test"
    for folder in (orphan, alive):
        folder.mkdir()
        (folder / "a.npy").write_bytes(b"x")
    files = dask_jobs._Files()
    try:
        assert not orphan.exists() and alive.exists()
        weight = np.arange(dask_jobs.SHARED_BYTES // 4, dtype=np.float32)
        key = dask_jobs.content_key(weight)
        blob, arrays = dask_jobs.pickled_job((np.sum, weight))
        path = files.put(key, weight)
        assert list(arrays) == [key] and files.put(key, weight.copy()) == path  # written once
        assert dask_jobs.run_job(blob, {}, {key: path}) == weight.sum()
        columns = np.asfortranarray(weight.reshape(64, -1))  # a layout pickle keeps, so must the file
        blob_f, arrays_f = dask_jobs.pickled_job((lambda a: (a.flags.f_contiguous, a.tolist()), columns))
        (key_f,) = arrays_f
        assert dask_jobs.run_job(blob_f, {}, {key_f: files.put(key_f, columns)}) == (True, columns.tolist())
        changed = weight.copy()
        changed[7] = -1
        np.save(path, changed)
        with pytest.raises(dask_jobs.Unreadable, match="contents are not"):
            dask_jobs.run_job(blob, {}, {key: path})
        os.unlink(path)
        with pytest.raises(dask_jobs.Unreadable, match="cannot read it"):
            dask_jobs.run_job(blob, {}, {key: path})
    finally:
        files.close()
        running.kill()
        running.wait()
        shutil.rmtree(alive, ignore_errors=True)
        shutil.rmtree(orphan, ignore_errors=True)
    assert not files.folder.exists()


def accuracy_run(tmp_path: Path, name: str, max_drop: float, **kwargs: Any) -> tuple[Any, Any, bytes]:
    from qcc.driver import compile as qcc_compile
    from tests.cli_util import DIGITS
    from tests.test_ptq_accuracy import _logit_error_metric

    x = np.load(DIGITS / "test.npz")["x"][:64]
    reference = qcc_compile_reference(DIGITS / "digits_cnn.onnx", x)
    _, report = qcc_compile(str(DIGITS / "digits_cnn.onnx"), tmp_path / name, target="onnx-qdq", quantize="fixed8",
                            calib=str(DIGITS / "calib.npz"), max_accuracy_drop=max_drop,
                            metric=_logit_error_metric(x, reference), overrides=("fc.weight_t=FIXED8_6",), **kwargs)
    return report["accuracy_control"], report.get("accuracy_control_notes"), (tmp_path / name).read_bytes()


def qcc_compile_reference(path: Path, x: np.ndarray) -> np.ndarray:
    from qcc.sim import run_model

    return run_model(load(str(path)), {"x": x})["logits"]


@pytest.mark.parametrize("max_drop", [0.0, 0.005])
def test_sharded_accuracy_search_ends_where_the_single_process_ends(tmp_path: Path, max_drop: float) -> None:
    """A pinned weight refuses its promotion (a note); with 0 the target is out of reach (the whole
    search), with 0.005 it is met part-way (what a wave measured past the stop is dropped)."""
    single = accuracy_run(tmp_path, "one.onnx", max_drop)
    section = single[0]
    if max_drop:
        assert section["met"] and 2 < section["evaluations"] < 10
    else:
        assert not section["met"] and section["evaluations"] >= 10 and single[1]  # the refused promotion's note
    assert accuracy_run(tmp_path, "two.onnx", max_drop, workers=2) == single


def test_sharded_bias_correction_is_identical(model_file: Path, data: dict[str, np.ndarray],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A static-batch model's bias correction is measured batch by batch: on 2 workers each runs
    half the batches, and the shifts are the single process's, bit for bit."""
    from qcc.passes import bias_correct

    model, layers, parts = quantized_batches(model_file, data)
    single = bias_correct.own_errors(model, layers, parts)
    shards: list[int] = []
    spread = Workers.map

    def spy(self: Workers, fn: Any, items: Any) -> Any:
        shards.extend(len(item.parts) for item in items)
        return spread(self, fn, items)

    monkeypatch.setattr(Workers, "map", spy)
    sharded = bias_correct.own_errors(model, layers, parts, Workers(2))
    assert shards == [6, 7]  # two workers, half the batches each
    assert len(single) == len(layers) == 3
    assert single.keys() == sharded.keys()
    assert all(np.array_equal(single[k], sharded[k]) for k in single)


def test_measurements_do_not_depend_on_blas_threads(tmp_path: Path) -> None:
    """OpenBLAS's sgemm sums in an order that depends on its thread count: a worker (one thread,
    or cores / N) must measure what this process measures with all its threads, so the
    measurement runs at one BLAS thread wherever it runs. Products large enough for OpenBLAS to
    thread them (64 channels, 48 x 48)."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from qcc.passes import bias_correct

    data = {"x": np.random.default_rng(1).standard_normal((3, 3, 48, 48)).astype(np.float32)}
    model, layers, parts = quantized_batches(static_batch_onnx(tmp_path / "wide.onnx", 64, 48), data)
    got = []
    for threads in (max(2, os.cpu_count() or 1), 1):
        with threadpoolctl.threadpool_limits(threads, user_api="blas"):
            got.append(bias_correct.own_errors(model, layers, parts))
    assert got[0].keys() == got[1].keys() and len(got[0]) == 3
    assert all(np.array_equal(got[0][k], got[1][k]) for k in got[0])
    # the sensitivity ranking's scores likewise (a worker's score is this process's)
    from qcc.passes.sensitivity import find_layers, layer_scores

    layered = find_layers(model)
    scores = []
    for threads in (max(2, os.cpu_count() or 1), 1):
        with threadpoolctl.threadpool_limits(threads, user_api="blas"):
            scores.append(layer_scores(model, layered, data, 1))
    assert len(scores[0]) >= 4 and all(scores[0]) and scores[0] == scores[1]


def quantized_batches(model_file: Path, data: dict[str, np.ndarray]) -> tuple[Model, list[Any], list[Any]]:
    """The tail quantized int8, its correctable layers, and its samples as static batches of one."""
    from qcc.passes import bias_correct
    from qcc.passes.calibrate import Calibrate
    from qcc.passes.quantize_affine import QuantizeAffine

    from qcc.pm.base import PassContext
    from qcc.pm.manager import PassManager

    model = load(str(model_file))
    PassManager([Calibrate(), QuantizeAffine()]).run(model, PassContext(calib_data=data))
    layers = [n for n in model.graph.nodes if bias_correct._correctable(n)]
    return model, layers, [{"x": data["x"][i:i + 1]} for i in range(len(data["x"]))]


CHURN = """
import resource, sys
import numpy as np
from qcc.pm.cluster import pickled_job, run_job

def churn(count):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(count):
        np.ones(1 << 18)  # 2 MB written and freed, as the interpreter does with every activation
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

print(churn(64), run_job(*pickled_job((churn, 64))), churn(64))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc thresholds")
def test_a_cluster_job_reuses_freed_arrays_under_the_nannys_malloc_settings() -> None:
    """Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536, which makes every large
    array a fresh mmap faulted in page by page (64 arrays of 512 pages: about 32k faults); a qcc
    job reuses the freed memory (about one array's pages), and the worker's settings come back after."""
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHURN], env=env, capture_output=True, text=True, check=True)
    before, job, after = map(int, done.stdout.split())
    pages = 64 * (2 << 20) // resource.getpagesize()
    assert before > pages * 0.9 and after > pages * 0.9  # the nanny's setting, outside a job
    assert job < pages // 8


def test_glibc_is_left_alone_where_it_adapts_and_compile_runs_in_the_adapted_heap(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import contextlib

    import qcc.driver
    from qcc.sim import heap

    for name in heap._FIXING_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(heap, "_glibc", lambda: pytest.fail("mallopt without a fixing variable"))
    with heap.adapted_heap():
        pass
    entered = []

    @contextlib.contextmanager
    def recorded() -> Any:
        entered.append(True)
        yield

    monkeypatch.setattr(qcc.driver, "adapted_heap", recorded)
    from tests.cli_util import DIGITS

    qcc.driver.compile(str(DIGITS / "digits_cnn.onnx"), tmp_path / "out.onnx", passes="")
    assert entered == [True]

