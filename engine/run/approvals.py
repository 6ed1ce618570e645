"""Approval gates: requests, version-bound decisions, revocation and resume tokens.

A decision binds an object — ``{"binds": {"contract:audience": <hash>, "artifact:D01":
[...], "verdict:A01": {"passed": …}}}`` for the bindings a gate declares (``run.gates``),
``{"plan_n": n, "contract_hash": h}`` for a legacy contract gate, the artifact hash(es) for
a legacy artifact gate — plus a scope and an expiry. It applies only while that object is
unchanged, it has not expired and it has not been revoked; otherwise the gate asks again
(a new request; the old one is marked superseded or expired). A decision whose choice is
not among the gate's ``proceed`` options (``hold``) applies but keeps the units waiting.

Resume tokens: every request issues one — random (``secrets.token_urlsafe``),
single use, expiring (24 h by default), bound to the run and the gate, stored
only as its sha256. The plain token is returned once, on the ApprovalRequest
from ``request_gate``. A token authorises exactly one thing: deciding that gate
of that run. Nothing else in keepstep accepts one — not ``revoke``, not a
budget raise, not a takeover — so a leaked token can at worst answer the one
question it was issued for, once, before it expires.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from keepstep.engine.core.plan import Gate
from keepstep.engine.core.timefmt import readable_utc
from keepstep.engine.errors import ApprovalError
from keepstep.storage import Store
from keepstep.storage.errors import ApprovalRefused
from keepstep.storage.hashing import canonical_json
from keepstep.storage.models import ApprovalRecord

TOKEN_TTL_SECONDS = 24 * 3600.0
DAY = 86400.0
OPEN_STATUSES = ("requested", "decided")


class ApprovalOption(BaseModel):
    """One answer a person can give, with what it would reuse and redo and what it costs."""

    model_config = ConfigDict(extra="forbid")
    label: str
    reuse: list[str] = Field(default_factory=list)
    redo: list[str] = Field(default_factory=list)
    estimate: dict[str, float] = Field(default_factory=dict)  # e.g. {"calls": 12, "cost": 0.4}
    note: str = ""
    # False when the gate would refuse this answer now (``note`` says what must change first).
    available: bool = True


class ApprovalRequest(ApprovalRecord):
    """A stored request; ``resume_token`` is set only on the one returned by request_gate.

    The token is excluded from dumps and reprs so it cannot leak into a status
    view, a log line or the handover bundle.
    """

    resume_token: str | None = Field(default=None, exclude=True, repr=False)


class GateStatus(BaseModel):
    """Whether a gate is open now, why, and the request/decision that says so."""

    open: bool
    reason: str
    request: ApprovalRecord | None = None


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _when(ts: float) -> str:
    return readable_utc(ts, seconds=False)


def describe_bound_object(obj: dict[str, Any]) -> str:
    """What an approval is bound to, as a person reads it (``contract:audience 1a2b…``,
    ``plan-v3, contract 1a2b…``, ``U07 artifact 1a2b…``)."""
    if "binds" in obj and isinstance(obj["binds"], dict):
        return ", ".join(_describe_ref(k, v) for k, v in obj["binds"].items()) or "nothing"
    if "plan_n" in obj:
        h = str(obj.get("contract_hash") or "")
        return f"plan-v{obj['plan_n']}" + (f", contract {h[:12]}" if h else "")
    if "artifact" in obj:
        art = obj["artifact"]
        shown = ", ".join(a[:12] for a in art) if isinstance(art, list) else str(art)[:12]
        unit = obj.get("artifact_unit")
        return (f"{unit} " if unit else "") + f"artifact {shown or '(none)'}"
    return canonical_json(obj)


def _describe_ref(ref: str, value: Any) -> str:
    if isinstance(value, dict) and "passed" in value:
        return f"{ref} " + ("passed" if value["passed"] else "failed")
    if isinstance(value, list):
        return f"{ref} {', '.join(str(v)[:12] for v in value) or '(none)'}"
    if isinstance(value, dict):
        return f"{ref} ({len(value)} file(s))"
    if isinstance(value, str):
        return f"{ref} {value[:12]}"
    return f"{ref} {value}"


def _what_changed(old: dict[str, Any], new: dict[str, Any]) -> str:
    if "binds" in old or "binds" in new:
        a, b = old.get("binds") or {}, new.get("binds") or {}
        moved = [ref for ref in dict.fromkeys([*a, *b])
                 if canonical_json(a.get(ref)) != canonical_json(b.get(ref))]
        parts_b = []
        for ref in moved:
            before, after = a.get(ref), b.get(ref)
            if isinstance(after, dict) and "passed" in after and isinstance(before, dict):
                was = "passed" if before.get("passed") else "failed"
                now = "passed" if after["passed"] else "failed"
                parts_b.append(f"{ref} changed from {was} to {now}")
            else:
                parts_b.append(f"{ref} changed")
        return "; ".join(parts_b) or "what the decision binds changed"
    parts = []
    if old.get("plan_n") != new.get("plan_n") and ("plan_n" in old or "plan_n" in new):
        parts.append(f"plan version changed from plan-v{old.get('plan_n')} to "
                     f"plan-v{new.get('plan_n')}")
    if old.get("contract_hash") != new.get("contract_hash") and (
            "contract_hash" in old or "contract_hash" in new):
        parts.append("the task contract changed")
    if old.get("artifact") != new.get("artifact") and ("artifact" in old or "artifact" in new):
        parts.append("the approved artifact changed")
    if not parts:
        parts.append(f"the approved object changed ({describe_bound_object(old)} → "
                     f"{describe_bound_object(new)})")
    return "; ".join(parts)


def approval_applies(approval: ApprovalRecord, *, current_bound_object: dict[str, Any],
                     now: float) -> tuple[bool, str]:
    """(applies, reason). Only a decided, unrevoked, unexpired approval of the same object
    applies."""
    if approval.status == "requested":
        return False, f"gate {approval.gate_id!r} has no decision yet"
    if approval.status == "revoked":
        return False, (f"approval of gate {approval.gate_id!r} was revoked by "
                       f"{approval.revoked_by}: {approval.revoke_reason}")
    if approval.status in ("expired", "superseded"):
        return False, f"approval request {approval.request_id} was {approval.status}"
    if approval.expires_at is not None and now >= approval.expires_at:
        return False, (f"approval of gate {approval.gate_id!r} expired at "
                       f"{_when(approval.expires_at)}")
    if canonical_json(approval.bound_object) != canonical_json(current_bound_object):
        return False, (f"approval of gate {approval.gate_id!r} no longer applies: "
                       f"{_what_changed(approval.bound_object, current_bound_object)}")
    expiry = f", until {_when(approval.expires_at)}" if approval.expires_at is not None else ""
    return True, (f"approved {approval.choice!r} by {approval.decided_by} for "
                  f"{describe_bound_object(approval.bound_object)}{expiry}")


def request_gate(
    store: Store,
    run_id: str,
    branch_id: str,
    gate: Gate,
    *,
    bound_object: dict[str, Any],
    options: list[ApprovalOption] | list[dict[str, Any]],
    now: float,
    token_ttl_seconds: float = TOKEN_TTL_SECONDS,
    request_id: str | None = None,
) -> ApprovalRequest:
    """Store a new request for ``gate`` and issue its resume token.

    Every older open row of the gate in this run and branch is retired in the same
    transaction: a decision that has expired becomes ``expired``, anything
    else ``superseded``. The returned request's ``resume_token`` is the only
    copy of the plain token; the database keeps its sha256.
    """
    opts = [ApprovalOption.model_validate(o) for o in options]
    retire: dict[str, str] = {}
    for old in store.approvals(run_id, branch_id=branch_id, gate_id=gate.id,
                               statuses=OPEN_STATUSES):
        expired = old.status == "decided" and old.expires_at is not None and now >= old.expires_at
        retire[old.request_id] = "expired" if expired else "superseded"
    token = secrets.token_urlsafe(32)
    record = store.create_approval_request(
        request_id=request_id or f"apr-{uuid.uuid4().hex[:16]}",
        run_id=run_id, branch_id=branch_id, gate_id=gate.id, unit=gate.unit,
        question=gate.question, options=[o.model_dump(mode="json") for o in opts],
        bound_object=bound_object, token_hash=hash_token(token),
        token_expires_at=now + token_ttl_seconds, retire=retire,
    )
    return ApprovalRequest(**record.model_dump(), resume_token=token)


_REFUSALS = {
    "token-unknown": ("resume token not recognised",
                      "check you copied the whole token, or answer the gate in keepstep itself"),
    "token-other": ("token is for another run or gate",
                    "use the token issued with this gate's request"),
    "token-used": ("token already used",
                   "a resume token works once; answer in keepstep or ask for a new request"),
    "token-expired": ("token expired",
                      "resume the run so the gate asks again (a new token is issued)"),
    "not-open": ("the request is no longer open (it was answered, superseded or expired)",
                 "resume the run to see the gate's current request"),
    "no-request": ("no such approval request", "resume the run so the gate asks"),
    "not-decided": ("only a decided approval can be revoked", ""),
}


def _refused(exc: ApprovalRefused, gate_id: str) -> ApprovalError:
    message, hint = _REFUSALS.get(exc.code, (str(exc), ""))
    return ApprovalError(f"gate {gate_id!r}: {message}", hint=hint or None)


def pending_requests(store: Store, run_id: str, branch_id: str | None = None
                     ) -> list[ApprovalRecord]:
    """Requests waiting for a person, oldest first."""
    return store.approvals(run_id, branch_id=branch_id, statuses=["requested"])


def _match_choice(request: ApprovalRecord, choice: str) -> str:
    labels = [str(o.get("label")) for o in request.options]
    if not labels or choice in labels:
        return choice
    folded = {label.casefold(): label for label in labels}
    if choice.casefold() in folded:
        return folded[choice.casefold()]
    raise ApprovalError(f"gate {request.gate_id!r} has no option {choice!r}",
                        hint="choose one of: " + ", ".join(labels))


def decide(
    store: Store,
    run_id: str,
    gate_id: str,
    choice: str,
    *,
    who: str,
    bound_object: dict[str, Any],
    scope: str = "gate",
    expires_days: float | None,
    token: str | None = None,
    now: float | None = None,
) -> ApprovalRecord:
    """Record a decision on the gate's open request (event ``approval.decided``).

    Without a token, the newest open request of the gate in the run (any branch)
    is decided; with one, the token's own request.

    Binds ``bound_object`` (which must be the object the request asked about),
    ``scope`` and an expiry ``expires_days`` from now (None: no expiry). With a
    ``token`` the decision goes to the token's request and consumes the token
    in the same transaction; a used, expired or foreign token raises
    ApprovalError and nothing is recorded.
    """
    now = store.now() if now is None else now
    token_hash = hash_token(token) if token is not None else None
    if token_hash is not None:
        problem = store.check_resume_token(token_hash, run_id, gate_id, now)
        if problem is not None:
            raise _refused(ApprovalRefused(problem, problem), gate_id)
        request = store.approval_by_token_hash(token_hash)
    else:
        open_ = store.approvals(run_id, gate_id=gate_id, statuses=["requested"])
        request = open_[-1] if open_ else None
    if request is None:
        raise ApprovalError(f"gate {gate_id!r} of run {run_id!r} has no open approval request",
                            hint="resume the run so the gate asks, then answer it")
    if canonical_json(request.bound_object) != canonical_json(bound_object):
        raise ApprovalError(
            f"gate {gate_id!r}: the request asked about "
            f"{describe_bound_object(request.bound_object)} but the run is now at "
            f"{describe_bound_object(bound_object)}",
            hint="resume the run: the gate asks again about the current version")
    chosen = _match_choice(request, choice)
    expires_at = None if expires_days is None else now + expires_days * DAY
    try:
        return store.decide_approval(
            run_id, gate_id, request.request_id, choice=chosen, decided_by=who, scope=scope,
            expires_at=expires_at, bound_object=bound_object, now=now, token_hash=token_hash)
    except ApprovalRefused as exc:
        raise _refused(exc, gate_id) from None


def revoke(store: Store, run_id: str, gate_id: str, who: str, reason: str, *,
           now: float | None = None) -> ApprovalRecord:
    """Revoke the gate's current decision; recorded as an ``approval.revoked`` decision event.

    Takes no resume token on purpose: revoking is not something a token authorises.
    """
    now = store.now() if now is None else now
    decided = store.approvals(run_id, gate_id=gate_id, statuses=["decided"])
    if not decided:
        raise ApprovalError(f"gate {gate_id!r} of run {run_id!r} has no decision to revoke")
    try:
        return store.revoke_approval(decided[-1].request_id, who=who, reason=reason, now=now)
    except ApprovalRefused as exc:
        raise _refused(exc, gate_id) from None


def gate_status(
    store: Store,
    run_id: str,
    branch_id: str,
    gate: Gate,
    current_bound_object: dict[str, Any],
    now: float,
    *,
    options: list[ApprovalOption] | list[dict[str, Any]] | None = None,
) -> GateStatus:
    """Is ``gate`` open for the run as it stands (``current_bound_object``) at ``now``?

    Read-only unless ``options`` is given: then, when no decision applies and
    no request about the current object is waiting, the gate asks again —
    a new request is created (older ones superseded/expired) and returned,
    with its resume token. Without ``options`` the caller asks (request_gate)
    when ``request`` is None.
    """
    rows = store.approvals(run_id, branch_id=branch_id, gate_id=gate.id)
    reason = (f"gate {gate.id!r} has no decision that applies" if rows
              else f"gate {gate.id!r} has not been asked yet")
    for row in reversed(rows):
        if row.status in ("decided", "revoked"):
            ok, why = approval_applies(row, current_bound_object=current_bound_object, now=now)
            if ok and row.choice is not None and not gate.lets_run(row.choice):
                return GateStatus(open=False, request=row, reason=(
                    f"gate {gate.id!r} was answered {row.choice!r}: "
                    f"{', '.join(gate.held_units())} wait (revoke it to be asked again)"))
            if ok:
                return GateStatus(open=True, reason=why, request=row)
            reason = why
            break
    same = canonical_json(current_bound_object)
    for row in reversed(rows):
        if row.status == "requested" and canonical_json(row.bound_object) == same:
            return GateStatus(open=False, request=row,
                              reason=f"gate {gate.id!r} waits for a decision ({row.question})")
    if options is None:
        return GateStatus(open=False, reason=reason, request=None)
    new = request_gate(store, run_id, branch_id, gate, bound_object=current_bound_object,
                       options=options, now=now)
    return GateStatus(open=False, reason=f"{reason}; asked again", request=new)


__all__ = [
    "TOKEN_TTL_SECONDS",
    "ApprovalOption",
    "ApprovalRequest",
    "GateStatus",
    "approval_applies",
    "decide",
    "describe_bound_object",
    "gate_status",
    "hash_token",
    "pending_requests",
    "request_gate",
    "revoke",
]
