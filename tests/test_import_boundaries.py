"""Imports point down only: app → engine → storage; the engine stays headless (no textual)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAYERS = {"app": "keepstep.app", "engine": "keepstep.engine", "storage": "keepstep.storage"}


def _modules(folder: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under a layer folder."""
    out: dict[str, Path] = {}
    base = REPO / folder
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base).with_suffix("")
        if "__pycache__" in rel.parts:
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join((LAYERS[folder], *parts))] = path
    return out


def _run_probe(code: str) -> dict:
    """Run code in a fresh interpreter (nothing preloaded by pytest) and read its JSON line."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_the_engine_and_storage_never_loads_textual() -> None:
    """Every engine/ and storage/ module imports in a fresh process without loading textual."""
    modules = ["keepstep.engine", *_modules("engine"), *_modules("storage")]
    result = _run_probe(
        f"""
        import importlib, json, sys
        failed, culprit = {{}}, None
        for name in {modules!r}:
            try:
                importlib.import_module(name)
            except Exception as exc:
                failed[name] = f"{{type(exc).__name__}}: {{exc}}"
            if culprit is None and "textual" in sys.modules:
                culprit = name
        print(json.dumps({{"failed": failed, "culprit": culprit}}))
        """
    )
    assert result["failed"] == {}, "modules that do not import: " + "; ".join(
        f"{k} ({v})" for k, v in result["failed"].items())
    assert result["culprit"] is None, f"importing {result['culprit']} loaded textual"


def test_importing_storage_loads_no_engine_or_app_module() -> None:
    """keepstep.storage and all its modules import without pulling in keepstep.engine or app."""
    modules = ["keepstep.storage", *_modules("storage")]
    result = _run_probe(
        f"""
        import importlib, json, sys
        for name in {modules!r}:
            importlib.import_module(name)
        print(json.dumps(sorted(m for m in sys.modules
                                if m.startswith(("keepstep.engine", "keepstep.app")))))
        """
    )
    assert result == []


def _imports(path: Path, module: str) -> set[str]:
    """Absolute names of every module a file imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base)
                target = f"{prefix}.{node.module}" if node.module else prefix
            else:
                target = node.module or ""
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names)
    return names


def _forbidden(folder: str, banned: tuple[str, ...]) -> list[str]:
    bad = []
    for module, path in _modules(folder).items():
        for name in sorted(_imports(path, module)):
            if any(name == b or name.startswith(b + ".") for b in banned):
                bad.append(f"{path.relative_to(REPO)} imports {name}")
    return bad


def test_storage_source_imports_neither_engine_nor_app() -> None:
    """No file under storage/ imports keepstep.engine or keepstep.app (not even relatively)."""
    assert _forbidden("storage", ("keepstep.engine", "keepstep.app", "textual")) == []


def test_engine_source_imports_neither_app_nor_textual() -> None:
    """No file under engine/ imports keepstep.app or textual (not even lazily in a function)."""
    assert _forbidden("engine", ("keepstep.app", "textual")) == []


def test_the_relative_import_resolver_sees_through_dots(tmp_path: Path) -> None:
    """The static scan resolves '..engine' from storage to keepstep.engine (guards the guard)."""
    f = tmp_path / "x.py"
    f.write_text("from ..engine import plan\nfrom . import db\nimport textual.app\n")
    assert {"keepstep.engine", "keepstep.engine.plan", "keepstep.storage.db",
            "textual.app"} <= _imports(f, "keepstep.storage.x")
