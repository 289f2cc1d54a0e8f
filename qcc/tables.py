"""Name -> handler tables that frontends and backends fill with a decorator (one per op)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., object])


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
