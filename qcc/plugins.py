"""Plugin loading: passes, frontends and backends by name, built-ins registered the same way.

Each `qcc.plugins` entry point names a `Plugin` object. Factories are lazy ("module:attr" strings
or callables), so listing names never imports a heavy framework. Discovery order is sorted by
distribution and entry-point name, so it is the same on every machine.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from qcc.errors import QccError, UsageError

API_VERSION = 1
ENTRY_POINT_GROUP = "qcc.plugins"
BUILTIN = "qcc (built-in)"

Factory = Any  # "module:attr" or a zero-argument callable returning the object


class PluginError(QccError):
    """A plugin could not be loaded or conflicts with another one."""

    exit_code = 2
    kind = "plugin error"


@attrs.frozen
class Plugin:
    """What a plugin contributes. Point a `qcc.plugins` entry point at an instance of this."""

    api_version: int = API_VERSION
    passes: Mapping[str, Factory] = attrs.field(factory=dict)
    frontends: Mapping[str, Factory] = attrs.field(factory=dict)
    backends: Mapping[str, Factory] = attrs.field(factory=dict)


@attrs.define
class Entry:
    kind: str
    name: str
    factory: Factory
    distribution: str
    _loaded: Any = None

    def load(self) -> Any:
        if self._loaded is None:
            target = self.factory
            try:
                if isinstance(target, str):
                    module, _, attr = target.partition(":")
                    obj: Any = importlib.import_module(module)
                    for part in attr.split("."):
                        obj = getattr(obj, part)
                    self._loaded = obj
                else:
                    self._loaded = target()
            except QccError:
                raise
            except Exception as exc:
                raise PluginError(
                    f"{self.kind} {self.name!r} from {self.distribution} failed to load: {type(exc).__name__}: {exc}"
                ) from exc
        return self._loaded


@attrs.define
class Registry:
    entries: dict[tuple[str, str], Entry] = attrs.field(factory=dict)
    distributions: list[tuple[str, str, list[str]]] = attrs.field(factory=list)

    def add_plugin(self, plugin: Any, distribution: str, version: str = "") -> None:
        if not isinstance(plugin, Plugin):
            raise PluginError(f"plugin from {distribution} is a {type(plugin).__name__}, not qcc.plugins.Plugin")
        if plugin.api_version != API_VERSION:
            raise PluginError(
                f"plugin from {distribution} targets qcc plugin API {plugin.api_version}, this qcc has {API_VERSION}"
            )
        names: list[str] = []
        for kind, table in (("pass", plugin.passes), ("frontend", plugin.frontends), ("backend", plugin.backends)):
            for name, factory in table.items():
                key = (kind, name)
                if key in self.entries:
                    other = self.entries[key].distribution
                    raise PluginError(f"{kind} {name!r} is provided by both {other} and {distribution}")
                self.entries[key] = Entry(kind, name, factory, distribution)
                names.append(f"{kind}:{name}")
        self.distributions.append((distribution, version, names))

    def names(self, kind: str) -> list[str]:
        return sorted(name for k, name in self.entries if k == kind)

    def entry(self, kind: str, name: str) -> Entry:
        entry = self.entries.get((kind, name))
        if entry is None:
            known = ", ".join(self.names(kind)) or "none"
            raise UsageError(f"unknown {kind} {name!r} (known: {known})")
        return entry

    def pass_class(self, name: str) -> Any:
        cls = self.entry("pass", name).load()
        if getattr(cls, "name", None) != name:
            raise PluginError(f"pass {name!r} loads a class whose name is {getattr(cls, 'name', None)!r}")
        return cls

    def frontend(self, name: str) -> Any:
        return self.entry("frontend", name).load()

    def backend(self, name: str) -> Any:
        return self.entry("backend", name).load()


_REGISTRY: Registry | None = None
_AUTOLOAD = True


def set_autoload(enabled: bool) -> None:
    """`--no-plugins`: only built-ins (takes effect for the next `registry()` build)."""
    global _AUTOLOAD, _REGISTRY
    _AUTOLOAD = enabled
    _REGISTRY = None


def autoload_enabled() -> bool:
    return _AUTOLOAD and os.environ.get("QCC_DISABLE_PLUGIN_AUTOLOAD", "") not in ("1", "true", "yes")


def _discover(reg: Registry) -> None:
    from importlib.metadata import entry_points

    found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ((ep.dist.name if ep.dist else ""), ep.name))
    for ep in found:
        dist = ep.dist.name if ep.dist else ep.value
        version = ep.dist.version if ep.dist else ""
        try:
            plugin = ep.load()
        except Exception as exc:
            raise PluginError(f"plugin {ep.name!r} from distribution {dist} failed to import: {type(exc).__name__}: {exc}") from exc
        reg.add_plugin(plugin, dist, version)


def registry() -> Registry:
    global _REGISTRY
    if _REGISTRY is None:
        from qcc import __version__
        from qcc.builtin_plugin import BUILTINS

        reg = Registry()
        reg.add_plugin(BUILTINS, BUILTIN, __version__)
        if autoload_enabled():
            _discover(reg)
        _REGISTRY = reg
    return _REGISTRY


def register_pass(cls: Any, distribution: str = "in-process") -> Any:
    """Register a pass class from Python without packaging it (also usable as a decorator)."""
    registry().add_plugin(Plugin(passes={cls.name: (lambda: cls)}), distribution)
    return cls


def register(plugin: Plugin, distribution: str = "in-process") -> None:
    registry().add_plugin(plugin, distribution)


def frontend_for(path: str, explicit: str | None = None) -> Any:
    """The frontend for a model file: by explicit name, else by the file's extension."""
    reg = registry()
    if explicit:
        return reg.frontend(explicit)
    lower = path.lower()
    for name in reg.names("frontend"):
        fe = reg.frontend(name)
        if any(lower.endswith(ext) for ext in fe.extensions):
            return fe
    exts = sorted(e for n in reg.names("frontend") for e in reg.frontend(n).extensions)
    raise UsageError(f"{path}: no frontend reads this file type (supported: {', '.join(exts)})")


def backend_for(out: str, explicit: str | None = None) -> Any:
    """The backend for an output: by --target, else by OUT's extension (a directory means c)."""
    reg = registry()
    if explicit:
        return reg.backend(explicit)
    lower = out.lower().rstrip("/")
    for name in reg.names("backend"):
        be = reg.backend(name)
        if any(lower.endswith(ext) for ext in be.extensions):
            return be
    if "." not in os.path.basename(lower) or out.endswith("/"):
        if "c" in reg.names("backend"):
            return reg.backend("c")
    raise UsageError(f"{out}: cannot tell the target from the extension; pass --target ({', '.join(reg.names('backend'))})")


LazyCallable = Callable[[], Any]
