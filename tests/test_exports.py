"""Every name in every `__all__` under zaya_jax/ resolves: each module imports, then each exported name is fetched.

A package that exports lazily (`checkpoint.__getattr__`) is checked the same way, so an export pointing at a
module that was moved or removed fails here rather than in a user's `from zaya_jax.checkpoint import ...`.
"""

from __future__ import annotations

import importlib
import pkgutil

import zaya_jax


def _module_names() -> list[str]:
    return ["zaya_jax"] + sorted(m.name for m in pkgutil.walk_packages(zaya_jax.__path__, "zaya_jax."))


def test_every_module_imports_and_every_export_resolves():
    names = _module_names()
    assert len(names) > 50, names  # the walk found the package's modules, not an empty path
    broken = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except Exception as e:  # collect every failure, report them together
            broken.append(f"{name}: import fails: {e!r}")
            continue
        for export in getattr(module, "__all__", ()):
            try:
                getattr(module, export)
            except Exception as e:
                broken.append(f"{name}.{export}: {e!r}")
    assert not broken, "\n".join(broken)


def test_all_lists_only_strings_without_duplicates():
    for name in _module_names():
        exports = list(getattr(importlib.import_module(name), "__all__", ()))
        assert all(isinstance(e, str) for e in exports), name
        assert len(exports) == len(set(exports)), f"{name}.__all__ repeats a name"
