"""Which store a project uses: KEEPSTEP_STORE_URL wins over keepstep.toml's [store] url, a
password never comes from keepstep.toml, and no url means the embedded SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest

from keepstep.storage import StorageError
from keepstep.storage.selection import choose_store, password_source


def test_the_environment_wins_over_keepstep_toml() -> None:
    env = {"KEEPSTEP_STORE_URL": "postgresql://ops@db.internal:5432/team"}
    choice = choose_store("postgresql://me@laptop/db", env=env)
    assert choice.url == env["KEEPSTEP_STORE_URL"] and choice.source == "KEEPSTEP_STORE_URL"
    assert choose_store("postgresql://me@laptop/db", env={}).source == "keepstep.toml"
    default = choose_store(None, env={})
    assert default.url is None and default.backend == "sqlite"


def test_a_password_in_keepstep_toml_is_refused_without_echoing_it() -> None:
    with pytest.raises(StorageError) as err:
        choose_store("postgresql://me:hunter2@db/team", env={})
    assert "hunter2" not in str(err.value) and "PGPASSWORD" in str(err.value)
    with pytest.raises(StorageError):
        choose_store("mysql://me@db/team", env={})


def test_the_password_source_is_named_never_shown(tmp_path: Path) -> None:
    choice = choose_store("postgresql://me@db/team", env={})
    assert password_source(choice, None, env={"PGPASSWORD": "x"}) == "PGPASSWORD"
    pgpass = tmp_path / "pgpass"
    pgpass.write_text("db:5432:team:me:secret\n")
    assert password_source(choice, None, env={"PGPASSFILE": str(pgpass)}) == str(pgpass)
    assert "keyring" in password_source(choice, "s3cret",
                                        env={"PGPASSFILE": str(tmp_path / "none")})


def test_keepstep_toml_refuses_a_store_url_with_a_password(tmp_path: Path) -> None:
    from keepstep.engine import load_config
    from keepstep.engine.errors import KeepstepError
    from tests.support.small_project import make_small_project

    root = make_small_project(tmp_path / "small")
    with (root / "keepstep.toml").open("a") as f:
        f.write('\n[store]\nurl = "postgresql://me:hunter2@db/team"\n')
    with pytest.raises(KeepstepError) as err:
        load_config(root)
    assert "hunter2" not in str(err.value) and "password" in str(err.value)
