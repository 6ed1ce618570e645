"""``Project`` and ``Run`` are one class each, defined once in engine/run/runtime.py (issue 24):
``engine.api`` is a facade, and what a project or run carries — the worker pool, the resume
tokens, the facts cache — is declared on it, never patched on from outside."""

from __future__ import annotations

import ast
from pathlib import Path

import keepstep.engine as engine
from keepstep.engine import api
from keepstep.engine.run import runtime
from keepstep.engine.run.facts_cache import FactsCache
from keepstep.engine.run.pool import WorkerPool
from tests.support.dag_project import FakeGateway, make_dag_project, use_dag_kind

ENGINE = Path(__file__).resolve().parent.parent / "engine"


def _engine_trees() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(encoding="utf-8"), filename=str(p))
            for p in sorted(ENGINE.rglob("*.py")) if "__pycache__" not in p.parts}


def test_project_and_run_are_each_one_class_defined_in_the_runtime() -> None:
    assert engine.Project is api.Project is runtime.Project
    assert engine.Run is api.Run is runtime.Run
    assert runtime.Project.__bases__ == (object,)
    assert runtime.Run.__bases__ == (object,)
    defined: dict[str, list[str]] = {}
    for path, tree in _engine_trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                if node.name in {"Project", "Run", "Workspace", "RunHandle"} or \
                        bases & {"Project", "Run"}:
                    defined.setdefault(node.name, []).append(str(path.relative_to(ENGINE)))
    assert defined == {"Project": ["run/runtime.py"], "Run": ["run/runtime.py"]}


def test_the_api_module_is_a_facade() -> None:
    tree = ast.parse((ENGINE / "api.py").read_text(encoding="utf-8"))
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert classes == []
    assert functions == ["open_project"]


def test_no_engine_module_patches_or_probes_a_run_or_project() -> None:
    """No getattr/setattr/hasattr on a run or a project: what they carry is declared."""
    found = []
    for path, tree in _engine_trees().items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in {"getattr", "setattr", "hasattr", "delattr"}
                    and node.args):
                continue
            target = node.args[0]
            name = target.id if isinstance(target, ast.Name) else \
                target.attr if isinstance(target, ast.Attribute) else None
            if name in {"run", "project", "source", "the_run"}:
                found.append(f"{path.relative_to(ENGINE)}:{node.lineno} {ast.unparse(node)}")
    assert found == []


def test_the_pool_tokens_and_facts_are_declared_on_the_objects(tmp_path: Path) -> None:
    root = make_dag_project(tmp_path / "p", {"A": [], "B": ["A"]})
    with use_dag_kind(), api.open_project(
            root, gateway_factory=lambda ledger: FakeGateway(ledger)) as project:
        run = project.start_run("R")
        assert isinstance(run, runtime.Run) and run.project is project
        assert run.resume_tokens == {}
        assert isinstance(run.facts_cache(), FactsCache)
        assert run.facts_cache() is run.facts_cache()
        assert project._worker_pool is None  # made at the first claim, not at open
        assert run.run(jobs=2).decision == "done"
        pool = project._worker_pool
        assert isinstance(pool, WorkerPool) and project.worker_pool is pool
    assert project._worker_pool is None  # closed with the project


def test_a_head_read_before_this_process_own_commit_keeps_the_facts_cache(
        tmp_path: Path) -> None:
    """The scheduler reads the head outside the cache's lock: when a unit of ours commits (and
    is applied to the cache) before the lock is taken, that older head must neither move the
    cache back nor make it reload everything."""
    from keepstep.engine.core.state import UnitRecord, UnitState, unit_key
    from keepstep.storage import SQLiteStore

    store = SQLiteStore(tmp_path / ".keepstep")
    try:
        store.create_run("R", {"plan": {"n": 1}})
        cache = FactsCache(store, "R", "main")
        assert cache.refresh() == 0
        stale = store.get_head("R")
        rec = UnitRecord(state=UnitState.succeeded, attempt="U1/a1")
        version = store.commit_checkpoint("R", "main", 0,
                                          {unit_key("U1"): rec.model_dump(mode="json")})
        cache.apply(version, {"U1": rec})
        generation = cache.generation
        assert cache.refresh(stale) == 1  # the older read is ignored
        assert cache.generation == generation and set(cache.records) == {"U1"}
        assert cache.refresh(store.get_head("R")) == 1 and cache.generation == generation
    finally:
        store.close()
