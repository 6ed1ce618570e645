"""pyproject.toml lists every package folder, so an installed wheel is never missing one."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOP = {"keepstep.app": "app", "keepstep.engine": "engine", "keepstep.storage": "storage"}


@pytest.fixture(scope="module")
def setuptools_config() -> dict:
    with open(REPO / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["tool"]["setuptools"]


def _package_folders() -> dict[str, Path]:
    """Dotted name -> folder for every folder under app/, engine/, storage/ with __init__.py."""
    found: dict[str, Path] = {}
    for dotted, folder in TOP.items():
        for init in sorted((REPO / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(REPO / folder)
            if "__pycache__" in rel.parts:
                continue
            found[".".join((dotted, *rel.parts))] = init.parent
    return found


def _folder_of(package: str) -> Path:
    for dotted, folder in TOP.items():
        if package == dotted or package.startswith(dotted + "."):
            rest = package[len(dotted):].lstrip(".")
            return REPO / folder / Path(*rest.split(".")) if rest else REPO / folder
    raise AssertionError(f"{package} is outside keepstep.app/engine/storage")


def test_package_dir_maps_exactly_the_three_layers(setuptools_config: dict) -> None:
    """package-dir maps keepstep.app→app, keepstep.engine→engine, keepstep.storage→storage."""
    assert setuptools_config["package-dir"] == TOP


def test_every_folder_with_init_is_a_listed_package(setuptools_config: dict) -> None:
    """A subpackage folder missing from [tool.setuptools].packages would be left out of a wheel."""
    listed = set(setuptools_config["packages"])
    missing = sorted(set(_package_folders()) - listed)
    assert not missing, f"add to [tool.setuptools].packages in pyproject.toml: {missing}"


def test_every_listed_package_has_its_folder(setuptools_config: dict) -> None:
    """Each listed package resolves (through package-dir) to a folder holding __init__.py."""
    for package in setuptools_config["packages"]:
        folder = _folder_of(package)
        assert (folder / "__init__.py").is_file(), f"{package}: no {folder}/__init__.py"


def test_package_data_covers_every_stylesheet(setuptools_config: dict) -> None:
    """Every .tcss file under app/ matches a package-data pattern of its own package."""
    data = setuptools_config.get("package-data", {})
    packages = _package_folders()
    for sheet in sorted((REPO / "app").rglob("*.tcss")):
        owner = max((p for p, f in packages.items() if sheet.is_relative_to(f)),
                    key=lambda p: len(packages[p].parts))
        rel = str(sheet.relative_to(packages[owner]))
        assert any(fnmatch.fnmatch(rel, pat) for pat in data.get(owner, [])), (
            f"{sheet.relative_to(REPO)} is not in package-data for {owner}"
        )


def test_there_is_no_top_level_keepstep_folder() -> None:
    """The import name comes from package-dir alone; a keepstep/ folder would shadow it."""
    assert not (REPO / "keepstep").exists()
