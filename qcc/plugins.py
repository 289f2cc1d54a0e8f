"""Plugin loading: passes, frontends and backends by name, built-ins registered the same way.

Each `qcc.plugins` entry point names a `Plugin` object (or a zero-argument callable returning
one). Factories are lazy ("module:attr" strings or callables), so listing names never imports a
heavy framework. Discovery order is sorted by distribution and entry-point name, so it is the same
on every machine, and a name two distributions both claim is an error naming both: silently
letting one win would make a pipeline mean different things on different machines.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from qcc.errors import QccError, UsageError
from qcc.plugin_api import API_VERSION, Factory, Plugin

ENTRY_POINT_GROUP = "qcc.plugins"
BUILTIN = "qcc (built-in)"
DISABLE_ENV = "QCC_DISABLE_PLUGIN_AUTOLOAD"
KINDS = ("pass", "frontend", "backend")



class PluginError(QccError):
    """A plugin could not be loaded or conflicts with another one."""

    exit_code = 2
    kind = "plugin error"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
                    for part in filter(None, attr.split(".")):
                        obj = getattr(obj, part)
                    self._loaded = obj
                else:
                    self._loaded = target()
            except QccError:
                raise
            except Exception as exc:
                raise PluginError(
                    f"{self.kind} {self.name!r} from {self.distribution} failed to load: {_one_line(exc)}"
                ) from exc
        return self._loaded


@attrs.frozen
class Distribution:
    """One registered source of names: `qcc plugins` prints these."""

    name: str
    version: str
    contributions: tuple[str, ...]


@attrs.define
class Registry:
    entries: dict[tuple[str, str], Entry] = attrs.field(factory=dict)
    distributions: list[Distribution] = attrs.field(factory=list)

    def add_plugin(self, plugin: Any, distribution: str, version: str = "") -> None:
        """Add every contribution or none (a conflict leaves the registry as it was)."""
        if not isinstance(plugin, Plugin):
            raise PluginError(f"plugin from {distribution} is a {type(plugin).__name__}, not qcc.Plugin")
        if plugin.api_version != API_VERSION:
            raise PluginError(
                f"plugin from {distribution} targets qcc plugin API {plugin.api_version!r}, "
                f"this qcc {_qcc_version()} has API {API_VERSION}"
            )
        new: dict[tuple[str, str], Entry] = {}
        for kind, table in plugin.tables():
            for name, factory in table.items():
                if not isinstance(name, str) or not name:
                    raise PluginError(f"plugin from {distribution} has a {kind} with an invalid name {name!r}")
                key = (kind, name)
                if key in self.entries:
                    other = self.entries[key].distribution
                    raise PluginError(f"{kind} {name!r} is provided by both {other} and {distribution}")
                new[key] = Entry(kind, name, factory, distribution)
        self.entries.update(new)
        names = tuple(f"{kind}:{name}" for kind, name in new)
        self.distributions.append(Distribution(distribution, version, names))

    def names(self, kind: str) -> list[str]:
        return sorted(name for k, name in self.entries if k == kind)

    def entry(self, kind: str, name: str) -> Entry:
        entry = self.entries.get((kind, name))
        if entry is None:
            known = ", ".join(self.names(kind)) or "none"
            raise UsageError(f"unknown {kind} {name!r} (known: {known})")
        return entry

    def pass_class(self, name: str) -> Any:
        from qcc.pm.base import Pass

        entry = self.entry("pass", name)
        cls = entry.load()
        if not (isinstance(cls, type) and issubclass(cls, Pass)):
            raise PluginError(f"pass {name!r} from {entry.distribution} is {cls!r}, not a qcc.Pass subclass")
        if getattr(cls, "name", None) != name:
            raise PluginError(
                f"pass {name!r} from {entry.distribution} loads {cls.__name__}, whose name is {cls.name!r}"
            )
        return cls

    def frontend(self, name: str) -> Any:
        return self.entry("frontend", name).load()

    def backend(self, name: str) -> Any:
        return self.entry("backend", name).load()


_REGISTRY: Registry | None = None
_AUTOLOAD = True


def _qcc_version() -> str:
    from qcc import __version__

    return __version__


def set_autoload(enabled: bool) -> None:
    """`--no-plugins`: only built-ins (takes effect for the next `registry()` build)."""
    global _AUTOLOAD, _REGISTRY
    _AUTOLOAD = enabled
    _REGISTRY = None


def autoload_enabled() -> bool:
    """False under `--no-plugins` or QCC_DISABLE_PLUGIN_AUTOLOAD=1 (pytest's convention)."""
    return _AUTOLOAD and os.environ.get(DISABLE_ENV, "").strip().lower() not in ("1", "true", "yes", "on")


def discovered() -> list[Any]:
    """The `qcc.plugins` entry points in load order: by distribution name, then entry name."""
    from importlib.metadata import entry_points

    def key(ep: Any) -> tuple[str, str]:
        dist = getattr(ep, "dist", None)
        return ((dist.name if dist else "").lower().replace("_", "-"), ep.name)

    return sorted(entry_points(group=ENTRY_POINT_GROUP), key=key)


def _discover(reg: Registry) -> None:
    for ep in discovered():
        dist_info = getattr(ep, "dist", None)
        dist = dist_info.name if dist_info else f"<unknown distribution of {ep.value}>"
        version = dist_info.version if dist_info else ""
        where = f"plugin {ep.name!r} ({ep.value}) from distribution {dist} {version}".rstrip()
        try:
            plugin = ep.load()
            if callable(plugin) and not isinstance(plugin, Plugin):
                plugin = plugin()
        except QccError as exc:
            raise PluginError(f"{where} failed to import: {exc}") from exc
        except Exception as exc:
            raise PluginError(f"{where} failed to import: {_one_line(exc)}") from exc
        reg.add_plugin(plugin, dist, version)


def registry() -> Registry:
    """The process-wide registry: built-ins first, then (unless disabled) the entry points."""
    global _REGISTRY
    if _REGISTRY is None:
        from qcc.builtin_plugin import BUILTINS

        reg = Registry()
        reg.add_plugin(BUILTINS, BUILTIN, _qcc_version())
        if autoload_enabled():
            _discover(reg)
        _REGISTRY = reg
    return _REGISTRY


@contextlib.contextmanager
def scoped_registry(autoload: bool = False) -> Iterator[Registry]:
    """A fresh registry for the block (tests registering passes), the old one restored after."""
    global _AUTOLOAD, _REGISTRY
    saved = (_AUTOLOAD, _REGISTRY)
    _AUTOLOAD, _REGISTRY = autoload, None
    try:
        yield registry()
    finally:
        _AUTOLOAD, _REGISTRY = saved


def register_pass(cls: Any, distribution: str | None = None) -> Any:
    """Register a pass class from Python without packaging it (also usable as a decorator).

    Registering the same class twice is a no-op; another class under a taken name is an error.
    """
    from qcc.pm.base import Pass

    if not (isinstance(cls, type) and issubclass(cls, Pass)) or not cls.name:
        raise UsageError(f"register_pass: {cls!r} is not a qcc.Pass subclass with a non-empty `name`")
    reg = registry()
    existing = reg.entries.get(("pass", cls.name))
    if existing is not None and _loads_to(existing, cls):
        return cls
    reg.add_plugin(Plugin(api_version=API_VERSION, passes={cls.name: _constant(cls)}),
                   distribution or f"{cls.__module__} (in-process)")
    return cls


def register(plugin: Plugin, distribution: str = "in-process") -> None:
    """Register a whole plugin from Python (passes, frontends and backends)."""
    registry().add_plugin(plugin, distribution)


def _loads_to(entry: Entry, obj: Any) -> bool:
    try:
        return entry.load() is obj
    except QccError:
        return False


def _constant(obj: Any) -> Callable[[], Any]:
    return lambda: obj


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
