"""Provider-wide limits: calls in flight, requests and tokens per minute, and a shared back-off.

Every unit that calls a provider shares that provider's ``ProviderLimiter`` (one per provider
name per process, see ``ProviderLimits.limiter``), so the limits hold however many units are in
flight. A 429 backs the whole provider off — every caller waits until the back-off ends
(Retry-After honoured) — instead of each unit hammering the provider on its own schedule.

Callers may rely on:
- ``slot(tokens)`` returns only when a call may start: the back-off is over, fewer than
  ``max_concurrent`` calls are in flight, and the last minute's requests and estimated tokens
  leave room (a call larger than the whole token budget waits for an empty minute, then goes);
- the slot is released on leaving the ``with`` block, whatever happened inside;
- a cancel event makes a waiting ``slot`` raise ``RunCancelled`` within ``TICK_S``.

Pure standard library: no litellm, no storage.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from keepstep.engine.errors import RunCancelled

WINDOW_S = 60.0
TICK_S = 0.05


class ProviderLimiter:
    """Concurrency, rate and back-off for one provider, shared by threads."""

    def __init__(self, *, max_concurrent: int | None = None,
                 requests_per_minute: float | None = None,
                 tokens_per_minute: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_concurrent = max_concurrent
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self.clock = clock
        self._cond = threading.Condition()
        self._in_flight = 0
        self._window: deque[list[float]] = deque()  # [started, tokens] of the last minute
        self._backoff_until = 0.0
        self.peak_in_flight = 0
        self.backoffs = 0

    def configure(self, *, max_concurrent: int | None, requests_per_minute: float | None,
                  tokens_per_minute: float | None) -> None:
        with self._cond:
            self.max_concurrent = max_concurrent
            self.requests_per_minute = requests_per_minute
            self.tokens_per_minute = tokens_per_minute
            self._cond.notify_all()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def _wait_for(self, now: float, tokens: int) -> float:
        """0 when a call of ``tokens`` may start now, else seconds to wait (lock held)."""
        while self._window and self._window[0][0] <= now - WINDOW_S:
            self._window.popleft()
        waits = [self._backoff_until - now]
        if self.max_concurrent is not None and self._in_flight >= self.max_concurrent:
            waits.append(TICK_S)  # woken by a release
        if self.requests_per_minute is not None and \
                len(self._window) >= self.requests_per_minute:
            waits.append(self._window[0][0] + WINDOW_S - now)
        if self.tokens_per_minute is not None and self._window:
            used = sum(t for _, t in self._window)
            if used + tokens > self.tokens_per_minute:
                waits.append(self._window[0][0] + WINDOW_S - now)
        return max(0.0, *waits)

    @contextmanager
    def slot(self, tokens: int = 0, *, cancel: threading.Event | None = None
             ) -> Iterator[list[float]]:
        """Hold one call's place (see the module doc). The yielded entry's second item may
        be set to the call's real token count once known."""
        with self._cond:
            while True:
                if cancel is not None and cancel.is_set():
                    raise RunCancelled("cancelled while waiting for the provider's limits")
                now = self.clock()
                wait = self._wait_for(now, tokens)
                if wait <= 0:
                    break
                self._cond.wait(min(wait, TICK_S))
            entry = [now, float(tokens)]
            self._window.append(entry)
            self._in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self._in_flight)
        try:
            yield entry
        finally:
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    def back_off(self, seconds: float) -> None:
        """The provider said 429: nobody starts a call for ``seconds`` from now."""
        with self._cond:
            self._backoff_until = max(self._backoff_until, self.clock() + max(0.0, seconds))
            self.backoffs += 1
            self._cond.notify_all()


_REGISTRY: dict[str, ProviderLimiter] = {}
_REGISTRY_LOCK = threading.Lock()


def limiter_for(provider: str, limits: Any = False) -> ProviderLimiter:
    """The process's limiter for ``provider``, (re)configured from ``limits`` unless it is left
    out (an object with ``max_concurrent``, ``requests_per_minute``, ``tokens_per_minute``;
    None: no limits, the shared back-off only)."""
    with _REGISTRY_LOCK:
        limiter = _REGISTRY.get(provider)
        if limiter is None:
            limiter = _REGISTRY[provider] = ProviderLimiter()
    if limits is not False:
        limiter.configure(max_concurrent=getattr(limits, "max_concurrent", None),
                          requests_per_minute=getattr(limits, "requests_per_minute", None),
                          tokens_per_minute=getattr(limits, "tokens_per_minute", None))
    return limiter


class ProviderLimits:
    """keepstep.toml's ``[providers.NAME]`` tables as the gateway applies them: every
    provider gets a limiter (its back-off applies even without configured limits)."""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = dict(config or {})

    def limiter(self, provider: str) -> ProviderLimiter:
        return limiter_for(provider, self.config.get(provider))


__all__ = ["ProviderLimiter", "ProviderLimits", "limiter_for"]
