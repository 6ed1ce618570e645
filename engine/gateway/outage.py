"""A provider outage is the provider's state, not the unit's.

Transient trouble (429 with Retry-After, 5xx, timeouts, dropped connections) does not use up a
unit's attempts: the gateway backs the whole provider off (honouring Retry-After), keeps the
unit waiting and says so — "waiting for openai: rate limited, retry in 20 s" — through the
unit's progress (the CLI, the TUI and a notebook show a unit's current step). Only when the
provider has been failing for longer than ``provider_outage_minutes`` (keepstep.toml) does
the call end, with ``ProviderOutage``: the unit is blocked (a person decides when to resume),
never failed.

``ProviderOutage`` derives from ``QuotaExhausted`` so that every place that already blocks a
unit whose provider cannot serve it (the run loop) blocks it for an outage too; its
``error_class`` and message say which it is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from keepstep.engine.errors import QuotaExhausted, RateLimited

DEFAULT_OUTAGE_MINUTES = 10.0
_local = threading.local()


class ProviderOutage(QuotaExhausted):
    """The provider kept failing with transient errors past the configured outage limit."""

    error_class = "provider_outage"
    retryable = False

    def __init__(self, provider: str, down_s: float, last: str) -> None:
        minutes = down_s / 60
        super().__init__(
            f"the provider has been down for {minutes:.1f} minutes ({provider}: {last})",
            hint=f"check {provider}'s status page or your network, then `keepstep resume`; "
            "raise provider_outage_minutes in keepstep.toml to wait longer")
        self.provider = provider
        self.down_s = down_s


class OutageClock:
    """When each provider started failing (shared by every unit of a run's gateway)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def failed(self, provider: str, now: float) -> float:
        """Record a transient failure; seconds the provider has been failing."""
        with self._lock:
            since = self._since.setdefault(provider, now)
            self._count[provider] = self._count.get(provider, 0) + 1
        return max(0.0, now - since)

    def failures(self, provider: str) -> int:
        """Transient failures since the provider last answered, this one included (>= 1)."""
        with self._lock:
            return self._count.get(provider, 0) + 1

    def answered(self, provider: str) -> None:
        with self._lock:
            self._since.pop(provider, None)
            self._count.pop(provider, None)


def wait_text(provider: str, error: BaseException, seconds: float) -> str:
    """``waiting for openai: rate limited, retry in 20 s``."""
    why = "rate limited" if isinstance(error, RateLimited) else _why(error)
    return f"waiting for {provider}: {why}, retry in {max(1, round(seconds))} s"


def _why(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    if "timed out" in text:
        return "timed out"
    if "could not connect" in text:
        return "connection failed"
    if "HTTP 5" in text or "provider error" in text:
        return "server error"
    return "unavailable"


@contextmanager
def reporting(callback: Callable[[str], None]) -> Iterator[None]:
    """Within the block (in this thread), ``report_wait`` passes its text to ``callback``:
    a unit wraps its model calls so that a wait shows as its progress."""
    previous = getattr(_local, "callback", None)
    _local.callback = callback
    try:
        yield
    finally:
        _local.callback = previous


def report_wait(text: str) -> None:
    callback = getattr(_local, "callback", None)
    if callback is not None:
        try:
            callback(text)
        except Exception:  # noqa: BLE001, S110 - a display must never break a call
            pass


__all__ = ["DEFAULT_OUTAGE_MINUTES", "OutageClock", "ProviderOutage", "report_wait",
           "reporting", "wait_text"]
