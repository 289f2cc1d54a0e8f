"""The runtime interface: run one batch of a written artifact, say what measured it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import attrs
import numpy as np

from qcc.errors import InvalidInputError


@attrs.frozen
class Tolerance:
    """How far a runtime may be from qcc's simulator of the same model before it is a warning.

    `min_sqnr_db` None: bit-exact (the runtime computes what qcc's integer simulator computes).
    """

    min_sqnr_db: float | None
    min_agreement: float
    why: str


EXACT = Tolerance(None, 1.0, "integer kernels bit-exact with qcc's simulator")
FLOAT = Tolerance(60.0, 0.99, "float32 kernels: only the summation order differs (~1e-6 relative)")


class Runtime:
    """A written model, ready to run. Subclasses set the attributes and implement `run`."""

    name: str = ""
    """What measures: e.g. 'onnxruntime 1.23.2 (CPU, graph optimizations on)'."""
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    batch: int | None = None
    """The batch the artifact must be fed (None: any)."""
    tolerance: Tolerance = FLOAT

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One batch in (arrays by input name, float32), every output out (by output name)."""
        raise NotImplementedError

    def tensors(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """Every intermediate tensor by name for one batch, where the runtime can tell (else None)."""
        return None

    def close(self) -> None:
        """Release what `run` holds (a build directory, a session)."""

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bind_by_position(runtime: Runtime, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feeds keyed by the runtime's names: same names, else matched in order (a .nnb has none)."""
    if set(feeds) == set(runtime.inputs):
        return feeds
    if len(feeds) != len(runtime.inputs):
        raise InvalidInputError(f"{runtime.name}: the model has {len(runtime.inputs)} input(s), the data "
                                f"{len(feeds)}")
    return dict(zip(runtime.inputs, feeds.values()))


def run_batches(runtime: Runtime, feeds: dict[str, np.ndarray], batch: int,
                progress: Callable[[int], None] | None = None) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """(start, outputs) per batch: one batch of outputs alive at a time."""
    feeds = bind_by_position(runtime, feeds)
    count = len(next(iter(feeds.values()))) if feeds else 0
    for start in range(0, count, batch):
        yield start, runtime.run({k: v[start:start + batch] for k, v in feeds.items()})
        if progress is not None:
            progress(min(start + batch, count) - start)
