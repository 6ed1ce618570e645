"""classify(exc) is the one place an error becomes an attempt's ending (engine/run/ending.py);
it reads no store, so each case is checked here without a run."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from keepstep.engine.errors import (
    AuthError,
    BudgetExhausted,
    EffectRejected,
    KeepstepError,
    LeaseLost,
    QuotaExhausted,
    ReplayMiss,
    RunCancelled,
    SideEffectError,
    TransientModelError,
    UnitTimedOut,
)
from keepstep.engine.gateway.call_ledger import StoreCallLedger
from keepstep.engine.run.ending import EndingKind, classify
from keepstep.storage import (
    AttemptStatus,
    BudgetLimitReached,
    StaleFencingToken,
    StorageBusy,
    UnitStatusKind,
)


def test_a_budget_block_says_its_figures_without_parsing_the_message() -> None:
    """The reason is built from the refusal's figures: the text the old message parsing gave."""
    refusal = BudgetLimitReached("over", figures={"calls": {"used": 3, "limit": 3,
                                                            "requested": 1}})
    exc = StoreCallLedger(None, "R", "main")._exhausted("U07", refusal,  # type: ignore[arg-type]
                                                       "the call was not made")
    ending = classify(exc, "U07", "/tmp")
    assert ending is not None and ending.kind == EndingKind.block
    old = "budget: " + str(exc).split(" — ")[0].split(": ", 1)[-1]
    # Issue 23: no raise command in the reason (the status suggests the one new limit).
    assert ending.message == old
    assert ending.unit_status is not None
    assert ending.unit_status.status == UnitStatusKind.blocked
    assert ending.unit_status.details["kind"] == "budget"
    assert ending.status == AttemptStatus.blocked and ending.error_class == "budget"


@pytest.mark.parametrize(("exc", "kind", "status", "error_class", "final"), [
    (QuotaExhausted("no quota"), EndingKind.block, AttemptStatus.blocked, "quota", False),
    (AuthError("bad key"), EndingKind.block, AttemptStatus.blocked, "auth", False),
    (UnitTimedOut("U1: passed its time limit"), EndingKind.fail, AttemptStatus.timed_out,
     "timeout", False),
    (LeaseLost("taken"), EndingKind.fence, AttemptStatus.fenced, None, False),
    (StaleFencingToken("stale"), EndingKind.fence, AttemptStatus.fenced, None, False),
    (RunCancelled("stop"), EndingKind.cancel, AttemptStatus.cancelled, None, False),
    (ReplayMiss("no answer"), EndingKind.fail, AttemptStatus.failed, "replay", True),
    (TransientModelError("flaky"), EndingKind.fail, AttemptStatus.failed, "transient", False),
    (KeepstepError("bad input"), EndingKind.fail, AttemptStatus.failed, "error", True),
    (ValueError("a bug"), EndingKind.fail, AttemptStatus.failed, "internal", True),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), EndingKind.fail, AttemptStatus.failed,
     "input", True),
    (BudgetExhausted("U1: budget limit reached"), EndingKind.block, AttemptStatus.blocked,
     "budget", False),
])
def test_each_error_family_has_one_ending(exc: BaseException, kind: EndingKind,
                                          status: AttemptStatus, error_class: str | None,
                                          final: bool) -> None:
    ending = classify(exc, "U1", "/tmp")
    assert ending is not None
    assert (ending.kind, ending.status, ending.error_class, ending.final) == (
        kind, status, error_class, final)


def test_an_unsettled_effect_and_a_rejected_one_are_told_apart() -> None:
    unknown = classify(SideEffectError("no receipt"), "U1", "/tmp")
    rejected = classify(EffectRejected("HTTP 400"), "U1", "/tmp")
    assert unknown is not None and rejected is not None
    assert unknown.kind == rejected.kind == EndingKind.effect
    assert (unknown.rejected, rejected.rejected) == (False, True)


def test_a_full_disk_blocks_and_other_os_and_storage_errors_are_not_the_units(
        tmp_path: Path) -> None:
    full = classify(OSError(errno.ENOSPC, "No space left", str(tmp_path / "f")), "U3", tmp_path)
    assert full is not None and full.kind == EndingKind.block
    assert "ENOSPC" in full.message and "keepstep retry U3" in full.message
    assert full.unit_status is not None and full.unit_status.details == {"kind": "storage"}
    assert classify(OSError(errno.EACCES, "denied"), "U3", tmp_path) is None
    assert classify(StorageBusy("locked"), "U3", tmp_path) is None
    assert classify(KeyboardInterrupt(), "U3", tmp_path) is None


def test_an_unexpected_error_message_is_scrubbed() -> None:
    ending = classify(RuntimeError("key sk-abcdefghijklmnopqrstuvwxyz0123456789 leaked"),
                      "U5", "/tmp")
    assert ending is not None and ending.message.startswith("U5: unexpected RuntimeError")
    assert "abcdefghijklmnopqrstuvwxyz0123456789" not in ending.message
