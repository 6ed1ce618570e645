"""Plan size: the graph walks agree with networkx, and the parsed and checked plan is cached
by file hash (a second process reads it back; any change of the file or the checker misses).

No timing here: bench/plan_size.py prints the figures."""

from __future__ import annotations

import json
import os
import random
import shutil
import stat
import sys
from pathlib import Path
from typing import Any

import networkx as nx
import pytest
import tomli_w

from keepstep.engine import PlanValidationError, load_project_files
from keepstep.engine.core.decide import topo_order
from keepstep.engine.core.plan import Plan
from keepstep.engine.core.plan_checks import find_problems
from keepstep.engine.core.plan_graph import DependencyIndex
from keepstep.engine.files import plan_file
from keepstep.engine.files.plan_file import CACHE_NAME, PlanCache

PACK = Path(__file__).resolve().parents[1] / "sample_projects" / "market-entry"


def random_plan(rng: random.Random, n: int, *, cycle: bool = False) -> Plan:
    ids = [f"U{i}" for i in range(n)]
    rng.shuffle(ids)  # plan order is not dependency order
    rank = {uid: i for i, uid in enumerate(sorted(ids, key=lambda u: int(u[1:])))}
    units = []
    for uid in ids:
        earlier = [o for o in ids if rank[o] < rank[uid]]
        deps = rng.sample(earlier, min(len(earlier), rng.randint(0, 3)))
        if cycle and rank[uid] == 0 and n > 2:
            deps.append(next(o for o in ids if rank[o] == n - 1))
        units.append({"id": uid, "title": "t", "phase": "p", "kind": "intake",
                      "params": {"step": "schema"}, "depends_on": deps,
                      "required_final": rng.random() < 0.2})
    return Plan.model_validate({"unit": units})


@pytest.mark.parametrize("seed", range(25))
def test_the_linear_walks_agree_with_networkx(seed: int) -> None:
    """Topological order (ties by plan order), upstream sets and cycles: the same answers as
    networkx's per-node algorithms on random plans."""
    rng = random.Random(seed)
    plan = random_plan(rng, rng.randint(1, 40), cycle=seed % 5 == 0)
    g, index = plan.graph(), DependencyIndex(plan)
    position = {u.id: i for i, u in enumerate(plan.units)}
    if nx.is_directed_acyclic_graph(g):
        assert index.cycle() is None
        assert index.topo_order() == list(
            nx.lexicographical_topological_sort(g, key=lambda n: position[n]))
        assert topo_order(plan) == index.topo_order()
        required = plan.required_units()
        expected: set[str] = set()
        for r in required:
            expected |= nx.ancestors(g, r)
        assert index.upstream(required) == expected
    else:
        cycle = index.cycle()
        assert cycle is not None and cycle[0] == cycle[-1]
        assert all(g.has_edge(a, b) for a, b in zip(cycle, cycle[1:], strict=False))
        with pytest.raises(ValueError):
            index.topo_order()


def test_a_long_chain_of_final_units_is_checked() -> None:
    """3,000 units, each final and depending on the one before (the plan whose per-unit
    ancestor walk took 16 s): no problems, and a deliverable far up the chain is needed."""
    units = [{"id": f"C{i:05d}", "title": "t", "phase": "p", "kind": "intake",
              "params": {"step": "schema"}, "outputs": [f"out{i}.json"],
              "depends_on": [f"C{i - 1:05d}"] if i else [], "required_final": True}
             for i in range(3000)]
    plan = Plan.model_validate({"plan": {"deliverables": ["out0.json"]}, "unit": units})
    assert find_problems(plan) == []


def wide_project(tmp_path: Path, n: int) -> Path:
    root = tmp_path / "pack"
    shutil.copytree(PACK, root, ignore=shutil.ignore_patterns(".keepstep", "*.ipynb"))
    units = [{"id": f"W{i:04d}", "title": f"unit {i}", "phase": "p", "kind": "intake",
              "outputs": ["evidence-schema.json"], "params": {"step": "schema"},
              "depends_on": [f"W{j:04d}" for j in sorted({i - 1, i // 2}) if j >= 1],
              "required_final": i == n} for i in range(1, n + 1)]
    (root / "plan.toml").write_text(tomli_w.dumps({"unit": units}), encoding="utf-8")
    (root / ".keepstep").mkdir(mode=0o700)
    return root


def test_a_second_load_reads_the_cache_and_it_is_private(tmp_path: Path) -> None:
    """The first load parses and writes .keepstep/plan-cache.json (0600); the next reads it
    back: the same plan, fingerprint and (no) problems."""
    root = wide_project(tmp_path, 50)
    first = load_project_files(root)
    path = root / ".keepstep" / CACHE_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    cache = PlanCache(root / ".keepstep")
    plan = cache.load(root / "plan.toml")
    assert cache.hit and plan == first.plan
    assert cache.fingerprint(plan) == first.plan.fingerprint()
    again = load_project_files(root)
    assert again.plan == first.plan and again.plan_fingerprint() == first.plan.fingerprint()
    calls = []
    assert cache.problems({"x": 1}, lambda: calls.append(1) or []) == []
    assert PlanCache(root / ".keepstep").problems({"x": 1}, lambda: calls.append(2) or []) == []
    assert calls == [1, 2]  # a cache that never loaded this plan has nothing to give
    cache.flush()
    cache2 = PlanCache(root / ".keepstep")
    cache2.load(root / "plan.toml")
    assert cache2.problems({"x": 1}, lambda: calls.append(3) or []) == [] and calls == [1, 2]


def test_the_cache_misses_when_the_file_or_the_checker_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = wide_project(tmp_path, 20)
    load_project_files(root)
    text = (root / "plan.toml").read_text(encoding="utf-8")
    (root / "plan.toml").write_text(text.replace('title = "unit 3"', 'title = "unit three"'),
                                    encoding="utf-8")
    cache = PlanCache(root / ".keepstep")
    plan = cache.load(root / "plan.toml")
    assert not cache.hit and plan.unit_map()["W0003"].title == "unit three"
    cache.flush()
    assert PlanCache(root / ".keepstep").load(root / "plan.toml").units == plan.units
    monkeypatch.setattr(plan_file, "_checker_key", "another checker")
    cache = PlanCache(root / ".keepstep")
    cache.load(root / "plan.toml")
    assert not cache.hit


def test_a_cached_problem_is_still_reported(tmp_path: Path) -> None:
    """A plan with a problem fails the same way from the cache (the checks are cached, not
    skipped)."""
    root = wide_project(tmp_path, 5)
    text = (root / "plan.toml").read_text(encoding="utf-8")
    (root / "plan.toml").write_text(text.replace("required_final = true",
                                                 "required_final = false"), encoding="utf-8")
    errors = []
    for _ in range(2):
        with pytest.raises(PlanValidationError) as info:
            load_project_files(root)
        errors.append(info.value.errors)
    assert errors[0] == errors[1] and any("required_final" in e for e in errors[0])
    assert (root / ".keepstep" / CACHE_NAME).is_file()


def test_a_tampered_or_broken_cache_is_not_trusted(tmp_path: Path) -> None:
    """A cache whose plan has an unsafe unit id, or that is not JSON, is parsed again."""
    root = wide_project(tmp_path, 5)
    load_project_files(root)
    path = root / ".keepstep" / CACHE_NAME
    data = json.loads(path.read_text(encoding="utf-8"))
    data["plan"]["unit"][0]["id"] = "../../etc"
    path.write_text(json.dumps(data), encoding="utf-8")
    cache = PlanCache(root / ".keepstep")
    assert cache.load(root / "plan.toml").units[0].id == "W0001" and not cache.hit
    path.write_text("{not json", encoding="utf-8")
    cache = PlanCache(root / ".keepstep")
    assert cache.load(root / "plan.toml").units[0].id == "W0001" and not cache.hit


def test_no_state_folder_is_created_and_a_read_only_one_is_left_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = wide_project(tmp_path, 5)
    shutil.rmtree(root / ".keepstep")
    load_project_files(root)
    assert not (root / ".keepstep").exists()
    (root / ".keepstep").mkdir(mode=0o700)
    os.chmod(root / ".keepstep", 0o500)
    try:
        if os.access(root / ".keepstep", os.W_OK):
            # root (CI) writes a read-only folder anyway: refuse the write as the kernel
            # refuses any other user.
            real_open = os.open

            def refuse(path: Any, *args: Any, **kwargs: Any) -> int:
                if Path(path).parent == root / ".keepstep":
                    raise PermissionError(13, "Permission denied", str(path))
                return real_open(path, *args, **kwargs)

            monkeypatch.setattr(os, "open", refuse)
        load_project_files(root)
        assert list((root / ".keepstep").iterdir()) == []
    finally:
        os.chmod(root / ".keepstep", 0o700)


# -- linear checks, by operation counts --------------------------------------------------------

def lines_run(fn: Any) -> int:
    """Python lines executed by ``fn()`` (every frame it reaches): an operation count that does
    not depend on the machine's speed or load."""
    count = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return trace

    old = sys.gettrace()
    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(old)
    return count


def _unit(uid: str, kind: str, deps: list[str], **extra: Any) -> dict[str, Any]:
    params = {"intake": {"step": "schema"}, "extract": {}, "verify": {}}[kind]
    inputs = ["group:A"] if kind == "extract" else []
    return {"id": uid, "title": "t", "phase": "p", "kind": kind, "params": params,
            "inputs": inputs, "depends_on": deps, **extra}


def chain_of_finals(n: int) -> Plan:
    """Each unit final and depending on the one before (per-unit ancestor walks: n²)."""
    return Plan.model_validate({"unit": [
        _unit(f"C{i:05d}", "intake", [f"C{i - 1:05d}"] if i else [], required_final=True)
        for i in range(n)]})


def chain_of_verify_units(n: int) -> Plan:
    """An extract unit, then verify units each over the one before (a walk up to the extract
    from each verify unit: n²)."""
    units = [_unit("X0", "extract", [])]
    units += [_unit(f"V{i:05d}", "verify", [f"V{i - 1:05d}"] if i else ["X0"],
                    required_final=i == n - 1) for i in range(n)]
    return Plan.model_validate({"unit": units})


def fan_in(n: int) -> Plan:
    """One final unit gathering every other. (A scan of its dependency list per dependency,
    as ``DependencyIndex`` did, runs in C and is not counted: ``lines_run`` catches walks.)"""
    units = [_unit(f"F{i:05d}", "intake", []) for i in range(n)]
    units.append(_unit("ALL", "intake", [f"F{i:05d}" for i in range(n)], required_final=True))
    return Plan.model_validate({"unit": units})


@pytest.mark.parametrize("shape", [chain_of_finals, chain_of_verify_units, fan_in])
def test_the_plan_checks_do_linear_work(shape: Any) -> None:
    """Eight times the units, at most about eight times the lines run by ``find_problems``
    (a walk per unit would run ~64 times as many). Operation counts, not timings."""
    small, large = shape(100), shape(800)
    assert find_problems(small) == [] and find_problems(large) == []
    ratio = lines_run(lambda: find_problems(large)) / lines_run(lambda: find_problems(small))
    assert ratio < 10, f"{shape.__name__}: 8× the units ran {ratio:.1f}× the lines"


def test_a_narrowed_scope_is_found_in_one_walk(tmp_path: Path) -> None:
    """``takeover.scope_of`` over many units of a chain: linear work as well."""
    from keepstep.engine.run.takeover import scope_of

    def lines(n: int) -> int:
        plan = chain_of_finals(n)
        ids = [u.id for u in plan.units]
        assert scope_of(plan, ids[-n // 2:]) == set(ids)
        return lines_run(lambda: scope_of(plan, ids[-n // 2:]))

    assert lines(800) / lines(100) < 10
