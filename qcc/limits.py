"""Resource limits every reader enforces before it allocates anything.

Defaults suit models that fit a workstation and keep the peak memory of one compile under about
14 GB whatever the input (measured in docs/errors.md); override them per run with
`--limit NAME=VALUE` (CLI), `qcc.limits.configure(...)` (API) or `QCC_LIMIT_<NAME>` environment
variables.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import attrs

from qcc.errors import InvalidInputError, UsageError


@attrs.frozen
class Limits:
    """Defaults sized from measured peaks (docs/errors.md, "Resource limits"): the worst target (c)
    needs ~13x the parameter bytes, a quantized compile ~44 KB per node."""

    max_file_bytes: int = 2 * 1024**3  # protobuf's own ceiling for one message; the .nnb format's too
    max_tensor_elements: int = 1 << 31
    max_parameter_bytes: int = 1024**3
    max_nodes: int = 200_000
    max_archive_members: int = 10_000
    max_archive_bytes: int = 2 * 1024**3
    max_compression_ratio: int = 200
    max_settings_bytes: int = 16 * 1024**2  # YAML parses at ~1 MB/s and ~50 MB of memory per MB


_current: Limits | None = None


def current() -> Limits:
    global _current
    if _current is None:
        values = {}
        for field in attrs.fields(Limits):
            env = os.environ.get(f"QCC_LIMIT_{field.name.upper()}")
            if env:
                values[field.name] = _parse(field.name, env)
        _current = Limits(**values)
    return _current


def _parse(name: str, text: str) -> int:
    try:
        number = float(text)
        value = int(number)
    except (ValueError, OverflowError):  # "x", "nan", "inf"
        raise UsageError(f"limit {name}: {text[:40]!r} is not a finite number") from None
    if value <= 0 or value != number:
        raise UsageError(f"limit {name}: {text[:40]!r} must be a positive whole number")
    return value


def configure(pairs: Iterable[str] = (), **values: int) -> Limits:
    """Set limits from `NAME=VALUE` strings and/or keywords; returns the new limits."""
    global _current
    known = {f.name for f in attrs.fields(Limits)}
    updates = dict(values)
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or name not in known:
            raise UsageError(f"--limit {pair!r}: use NAME=VALUE with NAME one of {', '.join(sorted(known))}")
        updates[name] = _parse(name, text)
    for name in updates:
        if name not in known:
            raise UsageError(f"unknown limit {name!r}")
    _current = attrs.evolve(current(), **updates)
    return _current


def check_elements(count: int, what: str, source: str) -> None:
    limit = current().max_tensor_elements
    if count > limit:
        raise InvalidInputError(f"{source}: {what} has {count} elements, over the limit of {limit} "
                                "(raise it with --limit max_tensor_elements=N)")


def check_tensor(count: int, itemsize: int, what: str, source: str) -> None:
    """A tensor qcc is about to materialize: its elements and its bytes (as one parameter)."""
    check_elements(count, what, source)
    limit = current().max_parameter_bytes
    if count * itemsize > limit:
        raise InvalidInputError(f"{source}: {what} would take {count * itemsize} bytes, over the limit of {limit} "
                                "(raise it with --limit max_parameter_bytes=N)")


def check_count(kind: str, count: int, limit: int, source: str) -> None:
    if count > limit:
        raise InvalidInputError(f"{source}: {count} {kind}, over the limit of {limit}")
