"""Lazy re-exports (PEP 562) for ``keepstep.engine`` and its public namespaces: a public name
is imported from the module that defines it on first use, so importing the package or a
namespace loads nothing else (``keepstep status`` pays for neither litellm nor the SQLite
backend until it needs them)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for module ``package`` re-exporting ``exports`` (public
    name -> the module that defines it; a name mapped to ``package`` itself is a namespace
    submodule, ``package.<name>``)."""
    namespace = importlib.import_module(package)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if module == package:
            value = importlib.import_module(f"{package}.{name}")
        else:
            value = getattr(importlib.import_module(module), name)
        setattr(namespace, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(namespace)) | set(exports))

    return __getattr__, __dir__
