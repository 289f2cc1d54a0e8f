"""Progress bars (tqdm) for the long loops: calibration, sensitivity, --eval, torch loading.

Shown on stderr when it is a terminal, or anywhere with `--progress`; never with `-q`. The
driver decides (`PassContext.progress`); loops only ask for a bar.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def progress_bar(total: int | None, what: str, enabled: bool,
                 unit: str = "sample") -> Iterator[Callable[[int], None] | None]:
    """A callable that advances the bar by n units (None when disabled)."""
    if not enabled:
        yield None
        return
    from tqdm import tqdm

    bar = tqdm(total=total, desc=f"qcc {what}", unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True)
    try:
        yield bar.update
    finally:
        bar.close()
