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


# -- the layout rules (issue 9): what may import what ------------------------------------------
# Engine packages bottom-up; a module may import its own package and the ones before it.
# keepstep.engine itself ("public": the lazy re-exports of every public name) sits on top.
ENGINE_LAYERS = ("errors", "core", "files", "gateway", "kinds", "run", "report", "api", "drills",
                 "public")


def _engine_layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 2:
        return "public"
    return parts[2] if parts[2] in ENGINE_LAYERS else "api"


def test_the_faces_import_only_the_public_engine_api() -> None:
    """app/ imports keepstep.engine itself (its public names) and its public namespaces (their
    public names), no other engine submodule, no storage."""
    namespaces = _public_namespaces()
    bad = []
    for module, path in _modules("app").items():
        for name in sorted(_imports(path, module)):
            parent, _, last = name.rpartition(".")
            if name.startswith("keepstep.storage"):
                bad.append(f"{path.relative_to(REPO)} imports {name}")
            elif name.startswith("keepstep.engine.") and parent != "keepstep.engine" and \
                    parent not in namespaces:
                bad.append(f"{path.relative_to(REPO)} imports {name}")
            elif name.startswith("keepstep.engine.") and \
                    last not in namespaces.get(parent, _public_names()):
                bad.append(f"{path.relative_to(REPO)} imports {name} (not a public name)")
    assert bad == []


def _public_names() -> set[str]:
    import keepstep.engine as engine

    return set(engine.__all__)


def _public_namespaces() -> dict[str, set[str]]:
    """keepstep.engine's namespaces (``keepstep.engine.plan``, …) -> their public names."""
    import importlib

    import keepstep.engine as engine

    return {f"keepstep.engine.{n}": set(importlib.import_module(f"keepstep.engine.{n}").__all__)
            for n, module in engine._EXPORTS.items() if module == "keepstep.engine"}


def test_only_the_gateway_imports_litellm() -> None:
    """No file of app/, storage/ or engine/ outside engine/gateway/ imports litellm."""
    bad = []
    for folder in ("app", "engine", "storage"):
        for module, path in _modules(folder).items():
            if module.startswith("keepstep.engine.gateway"):
                continue
            bad += [f"{path.relative_to(REPO)} imports {n}" for n in _imports(path, module)
                    if n == "litellm" or n.startswith("litellm.")]
    assert bad == []


def test_the_core_is_pure() -> None:
    """engine/core/ imports nothing from storage, files, gateway, kinds, run, report or drills."""
    banned = ("keepstep.storage", "keepstep.app", *(f"keepstep.engine.{p}" for p in (
        "files", "gateway", "kinds", "run", "report", "drills", "api")))
    bad = [line for line in _forbidden("engine", banned)
           if line.startswith(str(Path("engine") / "core"))]
    assert bad == []


# run/runtime.py defines Project and Run once (issue 24): run/ and report/ modules are given
# them, and Run's view methods (status, deliverables, narrative, …) call report/. That module
# is the one arrow from run/ up to report/; report/ names it for types only (TYPE_CHECKING).
UPWARD_EXCEPTIONS = {("keepstep.engine.run.runtime", "report")}


def test_engine_packages_import_only_downwards() -> None:
    """Each engine package imports only itself and the packages below it (TYPE_CHECKING too)."""
    rank = {name: n for n, name in enumerate(ENGINE_LAYERS)}
    bad = []
    for module, path in _modules("engine").items():
        own = rank[_engine_layer(module)]
        for name in sorted(_imports(path, module)):
            if not name.startswith("keepstep.engine.") or name.count(".") < 2:
                continue
            target = _engine_layer(name)
            if rank[target] > own and (module, target) not in UPWARD_EXCEPTIONS:
                bad.append(f"{module} ({_engine_layer(module)}) imports {name} ({target})")
    assert bad == []


def test_the_public_api_map_matches_its_type_checking_imports() -> None:
    """keepstep.engine's lazy map and its TYPE_CHECKING imports name the same things."""
    import keepstep.engine as engine

    tree = ast.parse((REPO / "engine" / "__init__.py").read_text(encoding="utf-8"))
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom)
                typed.update({a.name: imp.module or "" for a in imp.names})
    assert typed == engine._EXPORTS
    for name in engine.__all__:
        assert getattr(engine, name) is not None


def test_each_public_namespace_map_matches_its_type_checking_imports() -> None:
    """Each namespace (keepstep.engine.plan, …) lists in __all__ exactly what its lazy map and
    its TYPE_CHECKING imports name, and every name resolves; keepstep.engine itself keeps to
    about 40 names besides them."""
    import importlib

    import keepstep.engine as engine

    namespaces = [n for n, module in engine._EXPORTS.items() if module == "keepstep.engine"]
    assert namespaces and len(engine._EXPORTS) - len(namespaces) <= 40
    for ns in namespaces:
        module = importlib.import_module(f"keepstep.engine.{ns}")
        tree = ast.parse((REPO / "engine" / f"{ns}.py").read_text(encoding="utf-8"))
        typed: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
                for imp in node.body:
                    assert isinstance(imp, ast.ImportFrom)
                    typed.update({a.name: imp.module or "" for a in imp.names})
        assert typed == module._EXPORTS, ns
        assert sorted(module.__all__) == sorted(typed), ns
        for name in module.__all__:
            assert getattr(module, name) is not None


def test_importing_the_decision_function_loads_no_storage_backend() -> None:
    """In a fresh interpreter, the pure core (decide, invalidation, explain) loads neither
    sqlite_utils nor the storage backend, nor the gateway, run or report packages. The one
    storage module it may load is the shared error base (keepstep.storage.errors, through
    engine/errors.py; keepstep.storage itself is a lazy package)."""
    result = _run_probe(
        """
        import json, sys
        import keepstep.engine.core.decide, keepstep.engine.core.invalidation
        import keepstep.engine.core.explain, keepstep.engine.core.changes
        shared = {"keepstep.storage", "keepstep.storage.errors"}
        print(json.dumps(sorted(m for m in sys.modules if m not in shared and m.startswith((
            "sqlite_utils", "sqlite3", "keepstep.storage", "keepstep.engine.run",
            "keepstep.engine.gateway", "keepstep.engine.report", "keepstep.engine.files",
            "litellm", "textual")))))
        """
    )
    assert result == []


def test_no_engine_or_storage_module_loads_litellm_when_imported() -> None:
    """In a fresh interpreter every engine and storage module imports without loading litellm:
    the gateway imports it lazily, on the first model call."""
    modules = ["keepstep.engine", *_modules("engine"), *_modules("storage")]
    result = _run_probe(
        f"""
        import importlib, json, sys
        culprit = None
        for name in {modules!r}:
            importlib.import_module(name)
            if culprit is None and "litellm" in sys.modules:
                culprit = name
        print(json.dumps(culprit))
        """
    )
    assert result is None, f"importing {result} loaded litellm"


def test_no_public_name_of_the_engine_returns_any() -> None:
    """Every public function and every public method of Project and Run says what it
    returns (no ``-> Any``, no missing return annotation)."""
    import inspect

    import keepstep.engine as engine

    untyped, checked = [], 0
    public = [(name, getattr(engine, name)) for name in engine._EXPORTS]
    for ns in [n for n, module in engine._EXPORTS.items() if module == "keepstep.engine"]:
        namespace = getattr(engine, ns)  # keepstep.engine.plan, …: their names count too
        public += [(f"{ns}.{name}", getattr(namespace, name)) for name in namespace._EXPORTS]
    for name, obj in public:
        members = ([(f"{name}.{m}", f) for m, f in vars(obj).items()
                    if not m.startswith("_") and inspect.isfunction(f)]
                   if inspect.isclass(obj) and name in ("Project", "Run") else
                   [(name, obj)] if inspect.isfunction(obj) else [])
        for label, fn in members:
            checked += 1
            returns = inspect.signature(fn).return_annotation
            if returns is inspect.Signature.empty or str(returns) in ("Any", "typing.Any"):
                untyped.append(label)
    assert untyped == [] and checked > 60, (untyped, checked)
