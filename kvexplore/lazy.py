"""Names a package exports but imports on first use.

A stage's package re-exports names whose modules import vLLM (or torch); the
package itself must stay cheap to import, so reading a model config, a GPU or
a request costs no vLLM import.  :func:`lazy_attributes` makes the module
``__getattr__`` (PEP 562) that imports such a name when it is first read and
keeps it in the package's namespace afterwards.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, names: Mapping[str, str], *,
                    submodules: bool = False) -> Callable[[str], Any]:
    """A ``__getattr__`` for ``package`` that imports ``names[name]`` (a module
    path) on first use of ``name`` and returns that module's attribute (kept
    in the package's namespace afterwards).  With ``submodules``, a public
    name that is a submodule of ``package`` (``kvexplore.rendering``) is
    imported and returned too.

    Any other name raises ``AttributeError`` naming the package, as a missing
    module attribute does.
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            namespace[name] = value
            return value
        if (submodules and not name.startswith("_")
                and importlib.util.find_spec(f"{package}.{name}") is not None):
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


__all__ = ["lazy_attributes"]
