"""What a plugin declares: the `Plugin` object its `qcc.plugins` entry point names.

Kept apart from the loader (`qcc.plugins`) so that qcc's own built-in table
(`qcc.builtin_plugin`) and third-party plugins depend on this small module only, and the loader
depends on both without an import cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

API_VERSION = 1

Factory = Any  # "module:attr" or a zero-argument callable returning the object


@attrs.frozen
class Plugin:
    """What a plugin contributes. Point a `qcc.plugins` entry point at an instance of this.

    `api_version` is required (no default) so a plugin states the API it was written against
    and a qcc with a different one refuses it instead of failing somewhere later.
    """

    api_version: int
    passes: Mapping[str, Factory] = attrs.field(factory=dict)
    frontends: Mapping[str, Factory] = attrs.field(factory=dict)
    backends: Mapping[str, Factory] = attrs.field(factory=dict)

    def tables(self) -> list[tuple[str, Mapping[str, Factory]]]:
        return [("pass", self.passes), ("frontend", self.frontends), ("backend", self.backends)]
