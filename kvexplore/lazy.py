"""Names a package exports but imports on first use.

A stage's package re-exports names whose modules import vLLM (or torch); the
package itself must stay cheap to import, so reading a model config, a GPU or
a request costs no vLLM import.  :func:`lazy_attributes` makes the module
``__getattr__`` (PEP 562) that imports such a name when it is first read and
keeps it in the package's namespace afterwards.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A ``__getattr__`` for ``package`` that imports ``names[name]`` (a module
    path) on first use of ``name`` and returns that module's attribute.

    Any other name raises ``AttributeError`` naming the package, as a missing
    module attribute does.
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


__all__ = ["lazy_attributes"]
