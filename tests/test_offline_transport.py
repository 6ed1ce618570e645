"""The offline model answers through the gateway's one request/response path without litellm:
its own transport gives what litellm's dispatcher to the same provider gave, and an offline
run never imports litellm."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keepstep.engine.errors import PermanentModelError
from keepstep.engine.gateway import client as gateway
from keepstep.engine.gateway.client import CallContext, ModelGateway, ModelRequest
from tests.support.small_project import make_small_project

CTX = CallContext(run_id="R", unit="U1", attempt="U1/a1")


class Ledger:
    def __init__(self) -> None:
        self.outcomes: list[str] = []

    def reserve(self, ctx: Any, **_: Any) -> str:
        return f"c{len(self.outcomes)}"

    def settle(self, call_id: str, **kwargs: Any) -> None:
        self.outcomes.append(kwargs["outcome"])


def block(payload: dict[str, Any]) -> str:
    return "Answer as JSON.\n\nINPUT\n```json\n" + json.dumps(payload) + "\n```\n"


def complete_both(messages: list[dict[str, Any]]) -> list[Any]:
    """The same request through the offline transport and through litellm's dispatcher."""
    out = []
    for fn in (None, lambda **kw: gateway._litellm().completion(**kw)):
        gw = ModelGateway(ledger=Ledger(), sleep=lambda s: None, api_key_lookup=lambda p: None,
                          completion_fn=fn)
        try:
            r = gw.complete(CTX, ModelRequest(model=gateway.OFFLINE_MODEL, messages=messages,
                                              expect_json=True))
            out.append((r.content, r.tokens_in, r.tokens_out, r.cost, r.finish_reason))
        except PermanentModelError as exc:
            out.append((type(exc).__name__, str(exc)))
    return out


def test_both_transports_answer_alike() -> None:
    ok = [{"role": "user", "content": block({"task": "summarise",
                                              "text": "The market grew 5% in 2023."})}]
    direct, via_litellm = complete_both(ok)
    assert direct == via_litellm and direct[3] == 0.0
    bad = [{"role": "user", "content": block({"task": "nope"})}]
    direct, via_litellm = complete_both(bad)
    assert direct == via_litellm and "unknown task" in direct[1]


@pytest.mark.parametrize("models", [[gateway.OFFLINE_MODEL], []])
def test_warm_up_of_an_offline_run_imports_nothing(models: list[str]) -> None:
    code = ("import sys; from keepstep.engine.gateway import client; "
            f"client.warm_up({models!r}); print('litellm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "False"


def test_an_offline_run_never_imports_litellm(tmp_path: Path) -> None:
    """Three units of the small project (the third calls the model) in a fresh process."""
    root = make_small_project(tmp_path / "small")
    code = (
        "import sys\n"
        "from keepstep.engine.api import open_project\n"
        "with open_project(sys.argv[1]) as p:\n"
        "    run = p.start_run('R')\n"
        "    run.run(max_units=3)\n"
        "    calls = run.store.calls('R')\n"
        "import json\n"
        "print(json.dumps({'calls': [c.outcome for c in calls],\n"
        "                  'litellm': 'litellm' in sys.modules}))\n")
    out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["calls"] and set(seen["calls"]) == {"ok"}, seen
    assert seen["litellm"] is False
