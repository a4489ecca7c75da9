"""Packages whose names are imported from their modules when first used (PEP 562), so
that importing one of them loads only what a caller asks for: `corral.scenario` and
`corral.sim` keep the CLI from loading the engine and numpy unless it runs them. It
imports nothing of corral, and any package may use it."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(package: str, sources: Mapping[str, tuple[str, str]]) -> Callable[[str], Any]:
    """The module `__getattr__` of `package`: each name of `sources` (name -> its module
    in the package, and its name there) is imported when first asked for, then kept in
    the package's namespace; any other name is an AttributeError."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        source = sources.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = source
        value = namespace[name] = getattr(import_module(f"{package}.{module}"), attribute)
        return value

    return __getattr__
