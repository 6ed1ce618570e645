"""The side-effect ledger: external actions that happen at most once, and are never guessed.

Protocol (DESIGN §8): an *intent* row (idempotency key, request hash, fencing
token) is committed before the external action; the *receipt* (remote id)
after. The key of an action is derived from (run, unit, action, plan version), so
a retry or a replay of the same action sends the same key, and a new plan version
sends a new one. A *delivery* (the deliver kind) is keyed by what it is instead:
its destination and the sha256 of the bytes (``delivery_key``) — never the plan
version or the attempt — so the same bytes are never delivered twice to one
destination, whatever changed around them, and changed bytes get a new key.
An intent without a receipt is *unknown*: recovery asks the adapter
(``reconcile``). Found → committed. Definitely not found and the adapter says a
retry is safe → performed again with the SAME key. Cannot tell → the unit is
blocked for a person, and nothing is retried until that person decides
(``decide_unknown``) — or until a later recovery's lookup answers (``settle_waiting``: a
bounded number of lookups, never a send; found → committed, definitely not found and safe to
retry → "not sent", so the redo sends it with the same key). Only real unknowns wait.

Compensation (undoing a committed effect on cancel or rollback) is itself a
ledger entry with its own key, intent and receipt.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel

from keepstep.engine.errors import EffectRejected, LeaseLost, SideEffectError
from keepstep.engine.run.adapters import EffectAdapter, LookupResult
from keepstep.storage import EventIn, StaleFencingToken, Store, crash_point
from keepstep.storage.hashing import canonical_json, sha256_hex
from keepstep.storage.models import EffectRecord

UNRESOLVED = ("intent", "unknown")
RECEIPTED = ("committed", "compensation-intent", "compensated")


class EffectOutcome(BaseModel):
    key: str
    status: str
    remote_id: str | None = None
    performed: bool  # this call made the external action happen
    replayed: bool = False  # a receipt already existed: nothing was done
    effect: EffectRecord


ReconcileOutcome = Literal["committed", "retried", "failed", "blocked", "waiting"]


class ReconcileResult(BaseModel):
    key: str
    unit: str
    action: str
    adapter: str
    outcome: ReconcileOutcome
    remote_id: str | None = None
    reason: str = ""


# -- keys and hashes ---------------------------------------------------------------


def _slug(text: str, limit: int = 24) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:limit].lower() or "x"


def idempotency_key(run_id: str, unit: str, action: str, plan_n: int) -> str:
    """Deterministic, URL- and file-name-safe: ``ks-<run>-<unit>-<action>-p<n>-<sha256[:16]>``.

    The readable prefix is for people; the hash (over the exact values) is what
    makes two different actions never share a key.
    """
    digest = sha256_hex(canonical_json([run_id, unit, action, int(plan_n)]))[:16]
    return f"ks-{_slug(run_id)}-{_slug(unit)}-{_slug(action)}-p{int(plan_n)}-{digest}"


def destination_of(adapter: Any, name: str) -> str:
    """Where an adapter puts a delivered file called ``name``: its address (a webhook's URL,
    a drop folder's path, else its configured name) and the name."""
    address = getattr(adapter, "url", None) or getattr(adapter, "target_dir", None)
    return f"{address or adapter.name}/{name}"


def delivery_key(destination: str, sha256: str) -> str:
    """``ks-dlv-<destination>-<sha256[:12]>-<hash[:16]>``: the same bytes to the same
    destination always get this key (across plan versions, attempts and runs)."""
    digest = sha256_hex(canonical_json(["deliver", destination, sha256]))[:16]
    tail = destination.rstrip("/").rsplit("/", 1)[-1]
    return f"ks-dlv-{_slug(tail)}-{sha256[:12]}-{digest}"


def compensation_key(key: str) -> str:
    """The key of the entry that undoes ``key`` (derived, so a retried undo reuses it)."""
    return f"{key}-undo-{sha256_hex('undo:' + key)[:8]}"


def request_hash(request: Mapping[str, Any]) -> str:
    return sha256_hex(canonical_json(dict(request)))


def recorded_request_ok(row: EffectRecord) -> bool:
    """Whether the row's recorded request (or, for a delivery, its identity) still matches
    the request hash committed with the intent."""
    request = row.detail.get("request")
    identity = row.detail.get("identity")
    hashed = identity if isinstance(identity, dict) else request
    return isinstance(request, dict) and isinstance(hashed, dict) and \
        request_hash(hashed) == row.request_hash


def _safe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 200 else text[:197] + "..."


# -- performing ----------------------------------------------------------------------


def _outcome(row: EffectRecord, *, performed: bool, replayed: bool = False) -> EffectOutcome:
    return EffectOutcome(key=row.idem_key, status=row.status, remote_id=row.remote_id,
                         performed=performed, replayed=replayed, effect=row)


def _send(store: Store, adapter: EffectAdapter, row: EffectRecord,
          request: dict[str, Any]) -> EffectOutcome:
    """Call the adapter for an intent already committed, then commit the receipt."""
    key = row.idem_key
    try:
        remote_id = adapter.perform(key, request)
    except EffectRejected as exc:
        store.mark_effect(key, "failed", detail={"error": _safe(exc)}, only_if=UNRESOLVED)
        raise
    except Exception as exc:
        store.mark_effect(key, "unknown", detail={"error": _safe(exc)}, only_if=UNRESOLVED)
        raise SideEffectError(
            f"{row.unit}: outcome of {row.action!r} (key {key}) is unknown: {_safe(exc)}",
            hint="resume: recovery asks the adapter by key; if it cannot tell, the unit is "
            "blocked for you to decide (`keepstep effects`)",
        ) from exc
    crash_point("effect.after_send")
    done = store.mark_effect(key, "committed", remote_id=remote_id, only_if=UNRESOLVED)
    if done is None:  # someone (a reconcile) wrote the receipt first
        done = store.get_effect(key)
        assert done is not None
    return _outcome(done, performed=True)


def perform_effect(
    store: Store,
    adapter: EffectAdapter,
    *,
    run_id: str,
    branch_id: str,
    unit: str,
    attempt_id: str | None,
    action: str,
    request: dict[str, Any],
    plan_n: int,
    fencing_token: int | None,
    key: str | None = None,
    identity: Mapping[str, Any] | None = None,
) -> EffectOutcome:
    """Do an external action at most once per (run, unit, action, plan version) — or, with
    ``key`` (a ``delivery_key``), at most once per key whatever run, plan version or attempt
    asks. ``identity`` is what the request hash covers (default: the whole request), so that
    a redo whose request differs only in where the bytes lie (an artifact path) is the same
    action.

    1. commit the intent (key, request hash, fencing token) — a fenced
       executor raises LeaseLost here, before anything is sent;
       a key that already has a receipt returns it, with nothing sent;
    2. call the adapter;  3. commit the receipt (remote id).

    The request is kept in the row (to retry with the same key): it must hold
    no secrets and no source text. An earlier intent without a receipt is
    resolved like ``reconcile`` does (lookup first, never a blind resend).
    """
    key = key or idempotency_key(run_id, unit, action, plan_n)
    rhash = request_hash(identity if identity is not None else request)
    try:
        row, created = store.record_effect_intent(
            idem_key=key, run_id=run_id, branch_id=branch_id, unit=unit, attempt_id=attempt_id,
            action=action, adapter=adapter.name, request_hash=rhash,
            fencing_token=fencing_token, plan_n=plan_n,
            detail={"request": request, **({"identity": dict(identity)} if identity is not None
                                           else {})},
        )
    except StaleFencingToken as exc:
        raise LeaseLost(str(exc)) from None
    if not created:
        if row.request_hash != rhash:
            raise SideEffectError(
                f"{unit}: key {key} was already used for a different {action!r} request",
                hint="an action's request must not change within a plan version; change the "
                "plan (a new version gives a new key) or name the action differently",
            )
        if row.status in RECEIPTED:
            return _outcome(row, performed=False, replayed=True)
        if row.detail.get("needs_person"):
            raise SideEffectError(
                f"{unit}: {action!r} (key {key}) waits for a person: "
                f"{row.detail.get('reason', 'external outcome unknown')}",
                hint="decide it with `keepstep effects` (recheck, retry, done or abandon)")
        if row.status == "failed":  # definitely not done before: acting again is safe
            revived = store.mark_effect(key, "intent", only_if=["failed"])
            row = revived or row
        else:
            result = _resolve(store, adapter, row)
            fresh = store.get_effect(key)
            assert fresh is not None
            if result.outcome in ("committed", "retried"):
                return _outcome(fresh, performed=result.outcome == "retried")
            raise SideEffectError(f"{unit}: {result.reason}",
                                  hint="decide it with `keepstep effects`, then resume")
    crash_point("effect.after_intent")
    return _send(store, adapter, row, request)


# -- reconciling -----------------------------------------------------------------------


def _unblock_if_for(store: Store, row: EffectRecord) -> None:
    status = store.unit_statuses(row.run_id, row.branch_id).get(row.unit)
    if status is None or status.status != "blocked" or status.details.get("effect") != row.idem_key:
        return
    others = [e for e in store.effects(row.run_id, "unknown", unit=row.unit)
              if e.idem_key != row.idem_key and e.detail.get("needs_person")]
    if others:
        _block(store, others[0], others[0].detail.get("reason", "external outcome unknown"))
    else:
        store.clear_unit_status(row.run_id, row.branch_id, row.unit)


def _block(store: Store, row: EffectRecord, why: str) -> ReconcileResult:
    reason = f"external outcome unknown: {why}"
    current = store.unit_statuses(row.run_id, row.branch_id).get(row.unit)
    if not (current and current.status == "blocked" and current.reason == reason):
        # Block first, then flag the row: a crash between the two only repeats the lookup.
        store.set_unit_status(
            row.run_id, row.branch_id, row.unit, "blocked", reason=reason,
            details={"effect": row.idem_key, "action": row.action, "adapter": row.adapter},
        )
    store.mark_effect(row.idem_key, "unknown", detail={"needs_person": True, "reason": why},
                      only_if=UNRESOLVED)
    return ReconcileResult(key=row.idem_key, unit=row.unit, action=row.action,
                           adapter=row.adapter, outcome="blocked", reason=reason)


def _result(row: EffectRecord, outcome: ReconcileOutcome, reason: str = "",
            remote_id: str | None = None) -> ReconcileResult:
    return ReconcileResult(key=row.idem_key, unit=row.unit, action=row.action,
                           adapter=row.adapter, outcome=outcome, reason=reason,
                           remote_id=remote_id if remote_id is not None else row.remote_id)


def _lookup(adapter: EffectAdapter, key: str) -> tuple[LookupResult | None, str]:
    try:
        found = adapter.lookup(key)
    except Exception as exc:  # noqa: BLE001 - any failure of a lookup means "cannot tell"
        return None, f"{adapter.name} lookup failed ({_safe(exc)})"
    if found is None or found.found is None:
        return None, f"{adapter.name} cannot tell whether key {key} was applied"
    return found, ""


def _commit(store: Store, row: EffectRecord, remote_id: str | None, how: str) -> None:
    store.mark_effect(row.idem_key, "committed", remote_id=remote_id,
                      detail={"needs_person": False, "resolved": how}, only_if=UNRESOLVED)
    fresh = store.get_effect(row.idem_key)
    assert fresh is not None
    _unblock_if_for(store, fresh)


def _resolve(store: Store, adapter: EffectAdapter | None, row: EffectRecord) -> ReconcileResult:
    """Settle one intent without receipt, asking the adapter; block when it cannot tell."""
    if row.status == "intent":
        row = store.mark_effect(row.idem_key, "unknown", only_if=["intent"],
                                detail={"unknown_since": "intent without receipt"}) or row
    if adapter is None:
        return _block(store, row, f"no adapter named {row.adapter!r} is configured")
    if row.compensates is not None:
        return _resolve_compensation(store, adapter, row)
    found, why = _lookup(adapter, row.idem_key)
    if found is None:
        return _block(store, row, why)
    if found.found:
        _commit(store, row, found.remote_id, "found by key")
        return _result(row, "committed", f"{adapter.name} has key {row.idem_key}",
                       found.remote_id)
    if not found.retry_safe:
        return _block(store, row, f"{adapter.name} has no record of key {row.idem_key} and a "
                      "retry is not known to be safe")
    request = row.detail.get("request")
    if not isinstance(request, dict) or not recorded_request_ok(row):
        return _block(store, row, "the recorded request is missing or does not match its hash")
    try:
        remote_id = adapter.perform(row.idem_key, request)
    except EffectRejected as exc:
        store.mark_effect(row.idem_key, "failed", detail={"error": _safe(exc)},
                          only_if=UNRESOLVED)
        return _result(row, "failed", _safe(exc))
    except Exception as exc:  # noqa: BLE001 - outcome unknown again: a person decides
        return _block(store, row, f"retry with the same key failed ({_safe(exc)})")
    _commit(store, row, remote_id, "retried with the same key")
    return _result(row, "retried", f"{adapter.name} had no record; sent again with the same key",
                   remote_id)


def _resolve_compensation(store: Store, adapter: EffectAdapter,
                          row: EffectRecord) -> ReconcileResult:
    original = store.get_effect(row.compensates or "")
    if original is None:
        return _block(store, row, f"the compensated effect {row.compensates} is not in the ledger")
    found, why = _lookup(adapter, original.idem_key)
    if found is None:
        return _block(store, row, why)
    if not found.found:
        _commit(store, row, f"gone:{original.idem_key}", "original no longer found")
        return _result(row, "committed", f"{original.idem_key} is gone at {adapter.name}")
    undo = getattr(adapter, "compensate", None)
    if undo is None or not found.retry_safe:
        return _block(store, row, f"{original.idem_key} still exists at {adapter.name} and "
                      "undoing it again is not known to be safe")
    try:
        remote_id = undo(original.idem_key, original.remote_id)
    except Exception as exc:  # noqa: BLE001 - outcome unknown again: a person decides
        return _block(store, row, f"undo failed ({_safe(exc)})")
    _commit(store, row, remote_id, "undone again")
    return _result(row, "retried", "undone again with the same key", remote_id)


def reconcile(store: Store, adapters: Mapping[str, EffectAdapter],
              run_id: str) -> list[ReconcileResult]:
    """Settle every intent without a receipt in ``run_id`` (see the module docstring).

    Safe to run any number of times. Effects already waiting for a person are
    reported as ``waiting`` and not touched: only ``decide_unknown`` moves them.
    """
    out: list[ReconcileResult] = []
    for row in store.effects(run_id, UNRESOLVED):
        if row.detail.get("needs_person"):
            out.append(_result(row, "waiting", row.detail.get("reason", "")))
            continue
        out.append(_resolve(store, adapters.get(row.adapter), row))
    return out


PersonDecision = Literal["recheck", "retry", "done", "abandon"]


def decide_unknown(
    store: Store,
    adapter: EffectAdapter | None,
    key: str,
    *,
    decision: PersonDecision,
    who: str,
    reason: str = "",
    remote_id: str | None = None,
) -> EffectRecord:
    """A person settles an unknown effect; recorded as a ``decision.effect`` event.

    ``recheck``: ask the adapter again (commits only if found);
    ``retry``: send again with the same key (the person judged it safe);
    ``done``: the person confirmed it happened (``remote_id`` if known);
    ``abandon``: the person confirmed it did not happen and must not (→ failed).
    """
    row = store.get_effect(key)
    if row is None or row.status not in UNRESOLVED:
        raise SideEffectError(f"effect {key} is not waiting for a decision"
                              + (f" (it is {row.status})" if row else ""))
    event = EventIn(kind="decision.effect", unit=row.unit, payload={
        "key": key, "decision": decision, "who": who, "reason": reason})
    if decision in ("done", "abandon"):
        status = "committed" if decision == "done" else "failed"
        store.mark_effect(key, status, remote_id=remote_id, only_if=UNRESOLVED, event=event,
                          detail={"needs_person": False, "resolved": f"{decision} by {who}"})
        fresh = store.get_effect(key)
        assert fresh is not None
        _unblock_if_for(store, fresh)
        return fresh
    if adapter is None:
        raise SideEffectError(f"{decision} needs the {row.adapter!r} adapter")
    store.append_event(row.run_id, event.kind, branch_id=row.branch_id, unit=row.unit,
                       payload=event.payload)
    if decision == "recheck":
        found, _ = _lookup(adapter, key)
        if found is not None and found.found:
            _commit(store, row, found.remote_id, f"found on recheck by {who}")
    else:
        request = row.detail.get("request")
        if not isinstance(request, dict) or not recorded_request_ok(row):
            raise SideEffectError(f"effect {key}: the recorded request is missing or altered")
        try:
            remote = adapter.perform(key, request)
        except EffectRejected as exc:
            store.mark_effect(key, "failed", detail={"error": _safe(exc)}, only_if=UNRESOLVED)
        except Exception as exc:  # noqa: BLE001 - recorded; the effect stays unknown
            store.mark_effect(key, "unknown", detail={"error": _safe(exc)}, only_if=UNRESOLVED)
        else:
            _commit(store, row, remote, f"retried by {who}")
    fresh = store.get_effect(key)
    assert fresh is not None
    if fresh.status == "failed":
        _unblock_if_for(store, fresh)
    return fresh


class SettleResult(BaseModel):
    """How ``settle_effect`` settled an effect (or why it could not)."""

    key: str
    unit: str
    outcome: Literal["sent", "not sent", "unknown"]
    by: Literal["lookup", "person", "nobody"]
    remote_id: str | None = None
    reason: str = ""
    effect: EffectRecord


def settle_effect(
    store: Store,
    adapter: EffectAdapter | None,
    key: str,
    *,
    sent: bool | None,
    who: str,
    reason: str = "",
    remote_id: str | None = None,
) -> SettleResult:
    """Settle an effect whose outcome is unknown: ask the adapter by key first; only when it
    cannot tell, record the person's decision (``sent``: it happened, ``remote_id`` its
    reference; ``not sent``: it did not, so the next resume sends it again with the same key).

    A lookup that can tell wins over the person's word (the answer says so). With
    ``sent=None`` and a lookup that cannot tell, nothing is recorded (outcome ``unknown``).
    Raises SideEffectError for a key that is not waiting, and for a person's decision
    without a reason. Every settlement is a ``decision.effect`` event."""
    row = store.get_effect(key)
    if row is None or row.status not in UNRESOLVED:
        raise SideEffectError(f"effect {key} is not waiting to be settled"
                              + (f" (it is {row.status})" if row else " (no such key)"),
                              hint="list the effects with `keepstep effects`")
    lookup_key = row.compensates or key
    found, why = (_lookup(adapter, lookup_key) if adapter is not None
                  else (None, f"no adapter named {row.adapter!r} is configured"))
    if found is not None and (found.found or found.retry_safe):
        happened = bool(found.found) if row.compensates is None else not found.found
        outcome = "sent" if happened else "not sent"
        event = EventIn(kind="decision.effect", unit=row.unit, payload={
            "key": key, "decision": "settle", "outcome": outcome, "by": "lookup", "who": who,
            "reason": f"{row.adapter} lookup by key"})
        store.mark_effect(key, "committed" if happened else "failed",
                          remote_id=found.remote_id if happened else None, only_if=UNRESOLVED,
                          event=event, detail={"needs_person": False,
                                               "resolved": f"lookup by {who}"})
        fresh = store.get_effect(key)
        assert fresh is not None
        _unblock_if_for(store, fresh)
        told = "" if sent is None or sent == happened else (
            f"; the lookup answered, so it wins over 'you said {'sent' if sent else 'not sent'}'")
        return SettleResult(key=key, unit=row.unit, outcome=outcome, by="lookup",
                            remote_id=fresh.remote_id, effect=fresh,
                            reason=f"{row.adapter} {'has' if found.found else 'has no'} "
                            f"record of key {lookup_key}{told}")
    if sent is None:
        return SettleResult(key=key, unit=row.unit, outcome="unknown", by="nobody",
                            reason=why, effect=row)
    if not reason.strip():
        raise SideEffectError(f"settling {key} by hand needs a reason",
                              hint="say how you know, e.g. --reason 'the client confirmed'")
    fresh = decide_unknown(store, adapter, key, decision="done" if sent else "abandon",
                           who=who, reason=reason, remote_id=remote_id)
    return SettleResult(key=key, unit=row.unit, outcome="sent" if sent else "not sent",
                        by="person", remote_id=fresh.remote_id, effect=fresh,
                        reason=f"{why}; decided by {who}: {reason}")


# Recovery's bound on looking up effects that wait for a person: a handful of lookups (each
# under its adapter's own timeout) and a time budget, so a receiver that is down does not
# hold a resume up for long; what is left waits for the next resume or a person.
SETTLE_MAX_LOOKUPS = 20
SETTLE_BUDGET_S = 30.0


def settle_waiting(store: Store, adapters: Mapping[str, EffectAdapter], run_id: str, *,
                   max_lookups: int = SETTLE_MAX_LOOKUPS, budget_s: float = SETTLE_BUDGET_S,
                   clock: Any = time.monotonic) -> list[SettleResult]:
    """Look up, by key, each effect of ``run_id`` that waits for a person, and settle those
    whose adapter answers (``settle_effect`` with no person's word: recorded as a
    ``decision.effect`` event by ``recovery``). Never sends. Bounded by ``max_lookups`` and
    ``budget_s``; an adapter that still cannot tell leaves its effect waiting, untouched."""
    out: list[SettleResult] = []
    start = clock()
    for row in store.effects(run_id, UNRESOLVED):
        if not row.detail.get("needs_person"):
            continue
        adapter = adapters.get(row.adapter)
        if adapter is None or len(out) >= max_lookups or clock() - start > budget_s:
            continue
        try:
            result = settle_effect(store, adapter, row.idem_key, sent=None, who="recovery")
        except SideEffectError:
            continue  # settled meanwhile (a person, another front end)
        out.append(result)
    return out


# -- compensation ------------------------------------------------------------------------


def compensation_preview(
    store: Store,
    run_id: str,
    *,
    branch_id: str = "main",
    since_version: int | None = None,
    units: Iterable[str] | None = None,
) -> list[EffectRecord]:
    """Committed effects a cancel or rollback would undo (nothing is changed).

    ``since_version``: effects of attempts not in checkpoints up to that version
    (rolled back or never committed); ``units``: effects of those units. With
    neither, every committed effect of the branch (cancelling the run).
    """
    rows = [r for r in store.effects(run_id, "committed", branch_id=branch_id)
            if r.compensates is None]
    if units is not None:
        wanted = set(units)
        rows = [r for r in rows if r.unit in wanted]
    if since_version is not None:
        kept = {cp.attempt for cp in store.list_checkpoints(run_id, branch_id)
                if cp.version <= since_version and cp.attempt}
        rows = [r for r in rows if r.attempt_id not in kept]
    return rows


def compensate(store: Store, adapter: EffectAdapter, effect: EffectRecord, *,
               who: str = "keepstep", reason: str = "") -> EffectOutcome:
    """Undo a committed effect through its own ledger entry (key = compensation_key).

    The undo's intent is committed before the adapter is called and moves the
    original to ``compensation-intent``; its receipt moves the original to
    ``compensated``. Calling again after success does nothing.
    """
    original = store.get_effect(effect.idem_key)
    if original is None:
        raise SideEffectError(f"effect {effect.idem_key} is not in the ledger")
    if original.adapter != adapter.name:
        raise SideEffectError(f"effect {original.idem_key} was made through "
                              f"{original.adapter!r}, not {adapter.name!r}")
    ckey = compensation_key(original.idem_key)
    existing = store.get_effect(ckey)
    if existing is not None:
        if existing.status in RECEIPTED:
            return _outcome(existing, performed=False, replayed=True)
        if existing.status in UNRESOLVED:
            result = _resolve(store, adapter, existing)
            fresh = store.get_effect(ckey)
            assert fresh is not None
            if result.outcome in ("committed", "retried"):
                return _outcome(fresh, performed=result.outcome == "retried")
            raise SideEffectError(f"{original.unit}: {result.reason}",
                                  hint="decide it with `keepstep effects`")
    if original.status != "committed":
        raise SideEffectError(f"effect {original.idem_key} is {original.status}; only a "
                              "committed effect can be compensated")
    undo = getattr(adapter, "compensate", None)
    if undo is None:
        raise SideEffectError(f"adapter {adapter.name!r} cannot undo {original.action!r}",
                              hint="undo it by hand, then record that with `keepstep effects`")
    request = {"compensates": original.idem_key, "remote_id": original.remote_id}
    row, _ = store.record_effect_intent(
        idem_key=ckey, run_id=original.run_id, branch_id=original.branch_id, unit=original.unit,
        attempt_id=None, action=f"compensate:{original.action}", adapter=adapter.name,
        request_hash=request_hash(request), fencing_token=None, plan_n=original.plan_n,
        compensates=original.idem_key, detail={"request": request, "who": who, "reason": reason},
    )
    crash_point("effect.compensate.after_intent")
    try:
        remote_id = undo(original.idem_key, original.remote_id)
    except Exception as exc:
        store.mark_effect(ckey, "unknown", detail={"error": _safe(exc)}, only_if=UNRESOLVED)
        raise SideEffectError(f"undoing {original.action!r} (key {original.idem_key}) has an "
                              f"unknown outcome: {_safe(exc)}",
                              hint="resume: recovery asks the adapter") from exc
    done = store.mark_effect(ckey, "committed", remote_id=remote_id, only_if=UNRESOLVED)
    return _outcome(done or row, performed=True)


__all__ = [
    "EffectOutcome", "ReconcileResult", "compensate", "compensation_key",
    "compensation_preview", "decide_unknown", "idempotency_key", "perform_effect", "reconcile",
    "request_hash", "SettleResult", "settle_effect", "settle_waiting",
]
