"""The project's own packaging and set-up: what `pip install` says, and what each of the two commands installs."""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_metadata_builds_without_a_deprecation_warning() -> None:
    """setuptools warned twice on every install about a license given as a TOML table; an SPDX string is current."""
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"


def _planned(target: str, venv: Path) -> list[str]:
    """The commands `make TARGET` would run in a fresh clone (a virtual environment that does not exist yet)."""
    run = subprocess.run(
        ["make", "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    return run.stdout.splitlines()


def _installs(lines: list[str]) -> list[str]:
    return [line for line in lines if "pip install" in line and "--upgrade pip" not in line]


def test_make_sweep_installs_what_the_embedded_default_needs_and_not_the_test_extras(tmp_path: Path) -> None:
    (install,) = _installs(_planned("sweep", tmp_path / "venv"))
    assert install.endswith("pip install --quiet -e '.[tensorflow]'")
    assert "[test" not in install and ",test" not in install


def test_make_test_installs_the_test_extras(tmp_path: Path) -> None:
    (install,) = _installs(_planned("test", tmp_path / "venv"))
    assert install.endswith("pip install --quiet -e '.[test]'")
