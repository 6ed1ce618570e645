"""Store contract: each backend implements every capability Protocol; the suite calls
every Protocol method."""

from __future__ import annotations

import re
from pathlib import Path

from keepstep.storage import Store
from keepstep.storage.store import CAPABILITIES


def test_backend_implements_the_store_protocol(backend: Store) -> None:
    """Each backend is a runtime-checkable Store with a root and an artifact store."""
    assert isinstance(backend, Store)
    assert backend.root.name == ".keepstep"
    assert backend.artifacts.root.is_relative_to(backend.root)


def test_backend_implements_every_capability_protocol(backend: Store) -> None:
    """Each backend is an instance of every capability Protocol, and Store is their union."""
    for capability in CAPABILITIES:
        assert isinstance(backend, capability), capability.__name__
        assert issubclass(Store, capability)


def _protocol_methods() -> dict[str, str]:
    """method name -> the Protocol that declares it, for Store and every capability."""
    out: dict[str, str] = {}
    for proto in (*CAPABILITIES, Store):
        for name, value in vars(proto).items():
            if callable(value) and not name.startswith("_"):
                out.setdefault(name, proto.__name__)
    return out


def test_every_protocol_method_is_documented_with_what_it_returns() -> None:
    """Each Protocol method carries a docstring (what it returns, which errors it raises)."""
    undocumented = [f"{proto}.{name}" for name, proto in _protocol_methods().items()
                    if not (getattr(Store, name).__doc__ or "").strip()]
    assert undocumented == []


def test_the_contract_suite_calls_every_protocol_method() -> None:
    """A method of any capability that no contract test calls fails here (static scan)."""
    folder = Path(__file__).parent
    text = "".join(p.read_text(encoding="utf-8")
                   for p in sorted([*folder.glob("test_*.py"), folder / "conftest.py"]))
    methods = _protocol_methods()
    assert len(methods) > 50  # the scan sees the Protocols' methods
    never = sorted(f"{proto}.{name}" for name, proto in methods.items()
                   if not re.search(rf"\.{name}\(", text))
    assert never == [], f"no contract test calls: {never}"
