"""The worker pool that runs unit attempts: daemon threads, created on demand and reused.

One pool per project (``Project.worker_pool``), closed with the project. Threads, not
asyncio: litellm's completion is synchronous and the store keeps one SQLite connection per
thread, which a reused thread keeps. A thread stuck in a provider call never blocks the
process's exit.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class WorkerPool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_PoolThread] = []
        self._all: list[_PoolThread] = []

    def submit(self, fn: Callable[[], None]) -> None:
        with self._lock:
            worker = self._idle.pop() if self._idle else None
            if worker is None:
                worker = _PoolThread(self, len(self._all) + 1)
                self._all.append(worker)
                worker.start()
        worker.inbox.put(fn)

    def _back(self, worker: _PoolThread) -> None:
        with self._lock:
            self._idle.append(worker)

    def close(self) -> None:
        with self._lock:
            workers, self._all, self._idle = self._all, [], []
        for w in workers:
            w.inbox.put(None)


class _PoolThread(threading.Thread):
    def __init__(self, pool: WorkerPool, n: int) -> None:
        super().__init__(daemon=True, name=f"keepstep-unit-{n}")
        self.pool = pool
        self.inbox: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            fn = self.inbox.get()
            if fn is None:
                return
            try:
                fn()
            except BaseException:  # noqa: BLE001, S110 - the job reports its own outcome
                pass
            self.pool._back(self)


__all__ = ["WorkerPool"]
