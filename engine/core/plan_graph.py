"""The plan's dependency graph as plain adjacency lists, for linear walks.

networkx serves the small graphs of the views; on a 10,000-unit plan its per-node
``ancestors`` (once per required unit), ``find_cycle`` (an edge view per node) and
lexicographic sort cost seconds. ``DependencyIndex`` is built in one pass and each walk
visits every unit and edge at most once.
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from keepstep.engine.core.plan import Plan


@contextmanager
def gc_paused() -> Iterator[None]:
    """No garbage collection while many small containers are built: a process holding a
    100,000-unit plan scans all of it on each collection those allocations trigger (three
    quarters of building the index), and none of them is garbage yet."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class DependencyIndex:
    """The plan's dependency graph as adjacency lists (unit id -> the ids it depends on, and
    -> the ids depending on it), built in one pass; only edges between known units."""

    def __init__(self, plan: Plan) -> None:
        with gc_paused():
            self._build(plan)

    def _build(self, plan: Plan) -> None:
        self.ids: list[str] = list(dict.fromkeys(u.id for u in plan.units))
        known = set(self.ids)
        self.deps: dict[str, list[str]] = {i: [] for i in self.ids}
        self.dependents: dict[str, list[str]] = {i: [] for i in self.ids}
        # A set per unit beside its list: a repeated dependency counts once without a scan of
        # the list per dependency (quadratic for a unit that gathers thousands).
        has: dict[str, set[str]] = {i: set() for i in self.ids}
        for u in plan.units:
            deps, seen = self.deps[u.id], has[u.id]
            for d in u.depends_on:
                if d.unit in known and d.unit not in seen:
                    seen.add(d.unit)
                    deps.append(d.unit)
                    self.dependents[d.unit].append(u.id)

    def cycle(self) -> list[str] | None:
        """One dependency cycle as ``[a, b, …, a]`` (each depended on by the next), or None.

        Kahn's algorithm removes every unit not on or behind a cycle; from any unit left, the
        walk along its remaining dependencies must revisit a unit: that loop is a cycle."""
        waiting = {i: len(self.deps[i]) for i in self.ids}
        queue = [i for i, n in waiting.items() if n == 0]
        while queue:
            uid = queue.pop()
            del waiting[uid]
            for nxt in self.dependents[uid]:
                waiting[nxt] -= 1
                if waiting[nxt] == 0:
                    queue.append(nxt)
        if not waiting:
            return None
        start = next(i for i in self.ids if i in waiting)
        path, seen = [start], {start: 0}
        while True:
            nxt = next(d for d in self.deps[path[-1]] if d in waiting)
            if nxt in seen:
                loop = path[seen[nxt]:] + [nxt]
                return loop[::-1]  # dependency first: "U1 -> U2" reads "U2 depends on U1"
            seen[nxt] = len(path)
            path.append(nxt)

    def upstream(self, starts: Iterable[str], *, stop_when: set[str] | None = None
                 ) -> set[str]:
        """Every unit some unit of ``starts`` depends on, directly or not (``starts`` not
        included unless upstream of another), in one traversal. With ``stop_when``, stops as
        soon as all of those are found."""
        found: set[str] = set()
        todo = [s for s in starts if s in self.deps]
        missing = set(stop_when) if stop_when is not None else None
        while todo:
            for d in self.deps[todo.pop()]:
                if d not in found:
                    found.add(d)
                    todo.append(d)
                    if missing is not None:
                        missing.discard(d)
                        if not missing:
                            return found
        return found

    def topo_order(self) -> list[str]:
        """Units in dependency order, ties broken by plan order (what networkx's
        ``lexicographical_topological_sort`` keyed by plan position gives, with a heap over
        positions). Raises ValueError on a cycle."""
        position = {uid: n for n, uid in enumerate(self.ids)}
        waiting = {i: len(self.deps[i]) for i in self.ids}
        heap = [position[i] for i, n in waiting.items() if n == 0]
        heapq.heapify(heap)
        order: list[str] = []
        while heap:
            uid = self.ids[heapq.heappop(heap)]
            order.append(uid)
            for nxt in self.dependents[uid]:
                waiting[nxt] -= 1
                if waiting[nxt] == 0:
                    heapq.heappush(heap, position[nxt])
        if len(order) != len(self.ids):
            raise ValueError("the plan's dependencies contain a cycle")
        return order


__all__ = ["DependencyIndex", "gc_paused"]
