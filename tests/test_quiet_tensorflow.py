"""TensorFlow's C++ log lines never reach a detprof user unless DETPROF_DEBUG=1 asks for them.

The unit tests check ``quiet_tensorflow`` itself without loading TensorFlow; the end-to-end
test runs ``detprof models``, which loads it in detprof's own process.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from parameter_cache import cached_everywhere

from detprof.backends.tensorflow import DEBUG_ENV, LOG_LEVEL_ENV, quiet_tensorflow
from detprof.models import registry

REPO = Path(__file__).resolve().parents[1]
# absl's "I0000 00:00:1795419307.390363    4401 port.cc:153] ..." lines, its pre-init notice, and the two
# messages users reported by name.
CHATTER = re.compile(r"^[EWI]\d{4} |oneDNN|cuInit|absl", re.MULTILINE)
LOG_SOURCE = re.compile(r"^[EWI]\d{4} [\d:.]+\s+\d+ (\S+:\d+)\]", re.MULTILINE)


def _same_file(fd: int, path: str) -> bool:
    a, b = os.fstat(fd), os.stat(path)
    return (a.st_dev, a.st_ino, a.st_rdev) == (b.st_dev, b.st_ino, b.st_rdev)


def _fd2_identity() -> tuple[int, int, int]:
    st = os.fstat(2)
    return st.st_dev, st.st_ino, st.st_rdev


@pytest.fixture
def tensorflow_not_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Other tests in this process may have loaded TensorFlow; the block only acts before that."""
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    monkeypatch.delenv(DEBUG_ENV, raising=False)


@pytest.mark.usefixtures("tensorflow_not_loaded")
@pytest.mark.parametrize("previous", [None, "0"])
def test_block_hides_fd2_and_raises_the_log_level_then_restores_both(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], previous: str | None
) -> None:
    if previous is None:
        monkeypatch.delenv(LOG_LEVEL_ENV, raising=False)
    else:
        monkeypatch.setenv(LOG_LEVEL_ENV, previous)
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    before = _fd2_identity()
    with quiet_tensorflow():
        assert os.environ[LOG_LEVEL_ENV] == "3"
        assert _same_file(2, os.devnull)
        os.write(2, b"I0000 00:00:1.0 1 port.cc:153] oneDNN custom operations are on.\n")
        assert os.environ.get("TF_ENABLE_ONEDNN_OPTS") == onednn, "oneDNN changes numerics, not logging"
    os.write(2, b"detprof's own line\n")
    assert _fd2_identity() == before
    assert os.environ.get(LOG_LEVEL_ENV) == previous, "workers started later must log as before"
    assert capfd.readouterr().err == "detprof's own line\n"


@pytest.mark.usefixtures("tensorflow_not_loaded")
def test_exceptions_get_through_with_fd2_back(capfd: pytest.CaptureFixture[str]) -> None:
    before = _fd2_identity()
    with pytest.raises(ImportError, match="no such module"), quiet_tensorflow():
        raise ImportError("no such module")
    assert _fd2_identity() == before
    os.write(2, b"error line\n")
    assert capfd.readouterr().err == "error line\n"


@pytest.mark.usefixtures("tensorflow_not_loaded")
def test_detprof_debug_silences_nothing(monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(DEBUG_ENV, "1")
    monkeypatch.delenv(LOG_LEVEL_ENV, raising=False)
    before = _fd2_identity()
    with quiet_tensorflow():
        assert LOG_LEVEL_ENV not in os.environ
        assert _fd2_identity() == before
        os.write(2, b"I0000 tensorflow says\n")
    assert capfd.readouterr().err == "I0000 tensorflow says\n"


def test_once_tensorflow_is_loaded_the_block_does_nothing(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Workers load TensorFlow first thing; their log files keep what it says later."""
    monkeypatch.setitem(sys.modules, "tensorflow", sys.modules.get("tensorflow") or ModuleType("tensorflow"))
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.setenv(LOG_LEVEL_ENV, "2")
    with quiet_tensorflow():
        assert os.environ[LOG_LEVEL_ENV] == "2"
        os.write(2, b"W0000 later warning\n")
    assert capfd.readouterr().err == "W0000 later warning\n"


def _run_models(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``detprof models`` with every parameter count cached, so only the TensorFlow import is left."""
    cache = tmp_path / "detprof" / "model-parameters.json"
    cache.parent.mkdir(parents=True, exist_ok=True)
    keras = importlib.metadata.version("keras")
    cache.write_text(json.dumps(cached_everywhere(list(registry.BUILT_IN), keras)))
    base = {k: v for k, v in os.environ.items() if k not in (DEBUG_ENV, LOG_LEVEL_ENV)}
    return subprocess.run(
        [sys.executable, "-m", "detprof.cli", "models"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**base, "XDG_CACHE_HOME": str(tmp_path), "COLUMNS": "200", **env},
        timeout=300,
        check=False,
    )


@pytest.mark.slow
def test_detprof_models_keeps_tensorflow_quiet_unless_debugging(tmp_path: Path) -> None:
    quiet = _run_models(tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    assert "smallcnn" in quiet.stdout
    assert not CHATTER.findall(quiet.stderr), quiet.stderr

    # With DETPROF_DEBUG=1 whatever a bare import of Keras logs here comes through again (on a
    # machine where TensorFlow says nothing at all, there is nothing to compare).
    bare = subprocess.run(
        [sys.executable, "-c", "import keras"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k not in (DEBUG_ENV, LOG_LEVEL_ENV)},
        timeout=300,
        check=True,
    )
    debug = _run_models(tmp_path, **{DEBUG_ENV: "1"})
    assert debug.returncode == 0, debug.stderr
    assert set(LOG_SOURCE.findall(bare.stderr)) <= set(LOG_SOURCE.findall(debug.stderr)), debug.stderr
    assert ("absl::InitializeLog" in bare.stderr) <= ("absl::InitializeLog" in debug.stderr)
