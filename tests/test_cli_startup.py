"""The CLI's start-up in a fresh interpreter: lazy imports, entry point, keyring messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run_python(code: str, *, env: dict[str, str] | None = None, stdin: str = "",
               cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", **(env or {})}
    full_env.pop("KEEPSTEP_DEBUG", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, input=stdin, timeout=120, cwd=cwd, env=full_env)


def cli(*args: object, env: dict[str, str] | None = None,
        stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run keepstep's main() in a fresh interpreter, like the console script."""
    return run_python(
        f"""
        import sys
        from keepstep.app.cli.main import main
        sys.argv = ["keepstep", *{[str(a) for a in args]!r}]
        main()
        """, env=env, stdin=stdin)


def loaded_after_cli(*args: object) -> dict:
    """Run main() with ``args`` in a fresh interpreter; report which heavy modules it loaded."""
    proc = run_python(
        f"""
        import json, sys
        from keepstep.app.cli.main import main
        sys.argv = ["keepstep", *{[str(a) for a in args]!r}]
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = exc.code or 0
        print(json.dumps({{"code": code,
                           "litellm": "litellm" in sys.modules,
                           "textual": "textual" in sys.modules}}), file=sys.stderr)
        """)
    return json.loads(proc.stderr.strip().splitlines()[-1])


@pytest.fixture
def project_with_run(tmp_path: Path) -> Path:
    from keepstep.engine import open_project

    root = tmp_path / "proj"
    assert cli("init", root).returncode == 0
    with open_project(root) as p:
        p.start_run("R1")
    return root


def test_importing_the_cli_loads_no_engine_model_client_or_tui() -> None:
    """`import keepstep.app.cli.main` alone loads neither the engine, litellm nor textual."""
    proc = run_python(
        """
        import json, sys
        import keepstep.app.cli.main
        print(json.dumps(sorted(m for m in ("keepstep.engine", "litellm", "textual")
                                if m in sys.modules)))
        """)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def test_status_json_loads_neither_litellm_nor_textual(project_with_run: Path) -> None:
    """`keepstep status DIR --run R1 --json` never imports the model client or the TUI."""
    loaded = loaded_after_cli("status", project_with_run, "--run", "R1", "--json")
    assert loaded == {"code": 0, "litellm": False, "textual": False}


def test_status_dashboard_loads_neither_litellm_nor_textual(project_with_run: Path) -> None:
    """The text dashboard (the only run picked without --run) stays headless too."""
    loaded = loaded_after_cli("status", project_with_run)
    assert loaded == {"code": 0, "litellm": False, "textual": False}


def test_help_runs_through_the_entry_point() -> None:
    """main() --help exits 0 and lists the command groups."""
    proc = cli("--help")
    assert proc.returncode == 0, proc.stderr
    for name in ("init", "status", "run", "sources", "budget", "keys"):
        assert name in proc.stdout


def test_missing_project_through_main_has_no_traceback(tmp_path: Path) -> None:
    """Through the real entry point, a missing folder is one message and exit 2."""
    proc = cli("status", tmp_path / "nowhere")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ")


def test_corrupt_database_through_main_has_no_traceback(tmp_path: Path) -> None:
    """Through the real entry point, a garbage state.db is one message and exit 1."""
    root = tmp_path / "proj"
    assert cli("init", root).returncode == 0
    (root / ".keepstep").mkdir()
    (root / ".keepstep" / "state.db").write_bytes(os.urandom(8192))
    proc = cli("run", root, "--run", "R1")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ") and "state.db" in proc.stderr


def test_keys_set_without_a_keyring_backend_says_what_to_do() -> None:
    """With the null keyring (which would silently drop the key) `keys set` refuses clearly and
    points at the environment variable."""
    proc = cli("keys", "set", "openai", stdin="sk-test-123\n",
               env={"PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"})
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "no OS keyring backend" in proc.stderr and "OPENAI_API_KEY" in proc.stderr
    assert "sk-test-123" not in proc.stderr + proc.stdout


def test_keys_set_with_an_empty_key_is_a_usage_error() -> None:
    """An empty key is refused before the keyring is touched."""
    proc = cli("keys", "set", "openai", stdin="\n",
               env={"PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"})
    assert proc.returncode == 2
    assert "no key entered" in proc.stderr
