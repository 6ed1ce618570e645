"""Fuzzing, bounded for the suite (a few seconds per target): mutated plan.toml,
sources.toml, contract front matter, keepstep.toml, templates, source files of every format,
handover bundles and backups. Invariants (tests/support/fuzz_targets.py): only keepstep's own
errors, each naming the file; nothing written outside the target; bounded memory.
``bench/untrusted.py --fuzz N`` runs the same targets longer."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import fuzz_targets as ft

FAST = settings(max_examples=15, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROJECT = ft.project_template


def _real(name: str) -> bytes:
    return (PROJECT() / name).read_bytes()


@pytest.mark.parametrize("name", ["plan.toml", "sources.toml", "contract.md", "keepstep.toml"])
def test_mutated_project_files_give_only_named_keepstep_errors(name: str) -> None:
    """A mutated project file is loaded and validated: a KeepstepError naming it, or OK."""

    @FAST
    @given(data=ft.mutated(_real(name)))
    def check(data: bytes) -> None:
        ft.fuzz_project_file(name, data)
    check()


@FAST
@given(data=st.one_of(ft.mutated(b"[plan]\ntitle = \"t\"\n[[unit]]\nid = \"U1\"\n"),
                      st.binary(max_size=200)))
def test_arbitrary_plan_text_is_a_named_error(data: bytes) -> None:
    """Any text as plan.toml: a KeepstepError naming plan.toml, or a plan."""
    ft.fuzz_plan(data)


@FAST
@given(data=st.one_of(ft.mutated(b"+++\naudience = \"a\"\ngoal = \"g\"\n+++\nbody\n"),
                      st.binary(max_size=200)))
def test_arbitrary_contract_front_matter_is_a_named_error(data: bytes) -> None:
    """Any text as contract.md: a KeepstepError naming contract.md, or a contract."""
    ft.fuzz_contract(data)


@FAST
@given(data=st.one_of(ft.mutated((ft.PACK / "templates" / "memo.md").read_bytes()
                                 if (ft.PACK / "templates" / "memo.md").is_file()
                                 else b"# {{ title }}\n<!-- section: a -->\n{{ findings }}\n"),
                      st.text(max_size=120).map(str.encode)))
def test_mutated_templates_never_escape_the_sandbox(data: bytes) -> None:
    """Layout and placeholders of any text never raise; rendering raises template errors."""
    ft.fuzz_template(data)


@pytest.mark.parametrize("fmt", ["pdf", "docx", "xlsx", "pptx", "html", "csv", "md"])
def test_mutated_sources_convert_or_are_refused_naming_the_file(fmt: str) -> None:
    """A mutated real file of each format converts, or is refused with a ConversionError
    naming it; peak memory stays bounded."""
    before = ft.peak_mb()

    @settings(max_examples=8, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=ft.mutated(ft.source_bytes(fmt)))
    def check(data: bytes) -> None:
        ft.fuzz_convert(fmt, data)
    check()
    assert ft.peak_mb() - before < ft.RSS_GROWTH_MB


@pytest.mark.parametrize("fmt", ["docx", "xlsx", "pptx"])
def test_office_packages_with_mutated_parts_are_refused_cleanly(fmt: str) -> None:
    """A valid zip whose XML parts are damaged reaches the parsers: still only a
    ConversionError naming the file."""

    @settings(max_examples=8, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=ft.mutated_zip_members(ft.source_bytes(fmt)))
    def check(data: bytes) -> None:
        ft.fuzz_convert(fmt, data)
    check()


def test_mutated_bundles_and_backups_never_crash_or_write_outside() -> None:
    """verify-bundle on a mutated bundle returns a report; restore of a mutated backup
    raises only keepstep errors and writes only into its target."""
    bundle, backup, _root = ft.bundle_and_backup()

    @settings(max_examples=10, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=ft.mutated(bundle))
    def check_bundle(data: bytes) -> None:
        ft.fuzz_bundle(data)

    @settings(max_examples=5, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=ft.mutated(backup))
    def check_backup(data: bytes) -> None:
        ft.fuzz_backup(data)
    check_bundle()
    check_backup()
