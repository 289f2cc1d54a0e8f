"""Name -> handler tables that frontends and backends fill with a decorator (one per op).

A backend's table is keyed by IR op, so its keys are the ops it writes. A frontend's is keyed by
the source framework's op names, so each entry also declares the IR ops its importer may create
(`emits`): `qcc ops` reads those declarations, and the frontend checks every import against
them (`check_emitted`), so the support matrix is what the importers do, not a guess.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TypeVar

from qcc.errors import InternalError

F = TypeVar("F", bound=Callable[..., object])

Emits = Mapping[str, str] | Collection[str]
"""The IR ops an importer may create: one collection for all its names, or name -> its one op."""


def registrar(table: dict[str, F]) -> Callable[..., Callable[[F], F]]:
    """`@registrar(TABLE)("Conv", "ConvTranspose")` stores the function under each name."""

    def names(*keys: str) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            for key in keys:
                if key in table:
                    raise ValueError(f"{key!r} registered twice")
                table[key] = fn
            return fn

        return deco

    return names


def importer_registrar(table: dict[str, F], emitted: dict[str, frozenset[str]]) -> Callable[..., Callable[[F], F]]:
    """`@importer_registrar(TABLE, EMITS)("Gemm", emits=("Dense", "MatMul", "Add"))`: `registrar`
    for frontends, also recording under each name the IR ops the function may create."""
    store = registrar(table)

    def names(*keys: str, emits: Emits) -> Callable[[F], F]:
        if isinstance(emits, str):
            raise TypeError(f"emits={emits!r}: give a collection of op names, or a mapping")
        for key in keys:
            if key in emitted:
                raise ValueError(f"{key!r} registered twice")
            emitted[key] = frozenset([emits[key]] if isinstance(emits, Mapping) else emits)
        return store(*keys)

    return names


def emitted_ops(emitted: Mapping[str, frozenset[str]]) -> frozenset[str]:
    """Every IR op a frontend's importers may create."""
    return frozenset(op for ops in emitted.values() for op in ops)


def check_emitted(emitted: Mapping[str, frozenset[str]], key: str, ops: Iterable[str], where: str) -> None:
    """InternalError when the importer of `key` created an IR op its table entry does not declare."""
    stray = sorted(set(ops) - emitted.get(key, frozenset()))
    if stray:
        raise InternalError(f"{where}: the importer of {key} created IR op(s) {', '.join(stray)}, which its "
                            f"table entry does not declare (emits: {', '.join(sorted(emitted.get(key, ())))})")
