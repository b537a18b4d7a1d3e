"""The one results store shared by the sweep, kernels_bench and the stability study.

A results directory holds one sub-folder per kind of study (``sweep/``, ``kernels/``,
``stability/``), each with a manifest of the study's configuration, one JSON record per
run and Parquet tables beside them. Every file is written to a temporary name and renamed
into place, so a crash or Ctrl-C never leaves a half-written record, and ``--resume`` can
trust every record it finds.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import secrets
import stat
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import detprof.study_kinds as study_kinds
from detprof.errors import DetprofError, InputError, UsageError, environment_failure, output_failure
from detprof.records import checked

if TYPE_CHECKING:
    import pandas as pd

StudyKind = str
"""A kind's name (``study_kinds``): the folder a results directory holds it in; a knob study keeps its checks
inside its own (``knob_checks``)."""
SCHEMA_VERSION = 1
DONE_STATUSES = frozenset({"ok", "unsupported"})


# Create-only, never follow a link planted under the temporary name, and never leak the
# descriptor into a worker started while the file is open.
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
_TEMP_ATTEMPTS = 100


def _open_temp(path: Path) -> tuple[int, Path]:
    """A new, empty temporary file beside ``path`` (so the rename is atomic), created 0666 & ~umask.

    ``tempfile.mkstemp`` creates 0600, which would leave results unreadable by the rest of a
    shared machine whatever the user's umask says. Passing 0666 to ``open(2)`` lets the kernel
    apply the umask, so nothing reads or changes the process-wide umask (``os.umask`` is a
    set-and-restore that races with other threads).
    """
    for _ in range(_TEMP_ATTEMPTS):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, _TEMP_FLAGS, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path} after {_TEMP_ATTEMPTS} tries")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename, so a reader sees all or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _open_temp(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_output(path: Path, data: bytes, what: str) -> None:
    """A file the user named (a report, a baseline, CI's files), written atomically; a symbolic link's target in its
    place, and a device or a pipe (``/dev/null``, a FIFO) written into as it is: a rename would replace the link, or
    the device itself where the user may (root in a CI container). One line where the machine refuses (exit 74) or
    the path cannot hold the file (exit 3)."""
    try:
        target = path.resolve() if path.is_symlink() else path
        if target.exists() and not stat.S_ISREG(target.stat().st_mode) and not target.is_dir():
            with open(target, "wb") as stream:
                stream.write(data)
        else:
            atomic_write_bytes(target, data)
    except FileExistsError as exc:  # a folder on the way is a file
        raise InputError(f"cannot write {what} to {path}: {exc.filename} is a file, not a folder") from exc
    except OSError as exc:
        raise output_failure(exc, f"cannot write {what} to {path}") from exc


def user_cache_dir() -> Path:
    """detprof's own cache in the user's ($XDG_CACHE_HOME or ~/.cache): what one process worked out that the next can
    read instead of working it out again, keyed by what it depends on."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "detprof"


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())


def json_safe(value: Any) -> Any:
    """JSON has no NaN, infinity, pandas NA or numpy types: an undefined number becomes null.

    Applied recursively to dicts, lists, tuples and numpy arrays, so that every writer of
    JSON (records, summaries, ``parse --format json``) stores an unknown statistic the same way.
    """
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if hasattr(value, "tolist"):  # numpy scalars and arrays, without importing numpy here
        return json_safe(value.tolist())
    pandas = sys.modules.get("pandas")
    if pandas is not None and value is pandas.NA:
        return None
    return value


_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """A JSON file that must hold an object; anything else is one InputError line naming the file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable {what} ({exc})") from exc
    if not isinstance(data, dict):
        found = _JSON_KINDS.get(type(data), "null")
        raise InputError(f"{path}: not a detprof {what}: it holds {found}, not a JSON object")
    return data


def config_hash(config: dict[str, Any]) -> str:
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class ResultsStore:
    """One study's folder inside a results directory."""

    def __init__(self, root: Path, kind: StudyKind) -> None:
        self.root = Path(root)
        self.kind = kind
        self.dir = self.root / kind

    @property
    def manifest_path(self) -> Path:
        return self.dir / "manifest.json"

    def exists(self) -> bool:
        return self.manifest_path.is_file()

    def open(self, config: dict[str, Any], command: str, *, resume: bool) -> None:
        """Create the study folder, or re-open it for ``--resume`` with the same configuration."""
        digest = config_hash(config)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._unwritable(exc) from exc
        if self.exists():
            previous = self.manifest()
            if previous.get("config_hash") != digest:
                if resume:
                    raise UsageError(
                        f"cannot resume {self.dir}: it holds a {self.kind} of a different configuration "
                        "(use another --out, or the original options)"
                    )
                raise UsageError(
                    f"{self.dir} already holds a {self.kind} of a different configuration: choose another --out"
                )
            if not resume and any(self.records()):
                raise UsageError(f"{self.dir} already holds results: pass --resume to continue it, or another --out")
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(
                self.manifest_path,
                {
                    "schema_version": SCHEMA_VERSION,
                    "kind": self.kind,
                    "config": config,
                    "config_hash": digest,
                    "command": command,
                },
            )
        except OSError as exc:
            raise self._unwritable(exc) from exc

    def _unwritable(self, exc: OSError) -> DetprofError:
        """The machine's refusal (a full disk, a permission: exit 74), else an ``--out`` that cannot be a folder."""
        return environment_failure(exc) or UsageError(f"cannot write results to {self.root}: {exc.strerror or exc}")

    def manifest(self) -> dict[str, Any]:
        """The study's manifest; its ``config``, when present, is an object (readers may ``.get`` from it)."""
        manifest = read_json_object(self.manifest_path, "manifest")
        if not isinstance(manifest.get("config") or {}, dict):
            raise InputError(f"{self.manifest_path}: not a detprof manifest: its 'config' is not a JSON object")
        return manifest

    def record_path(self, run_id: str) -> Path:
        return self.dir / "runs" / f"{run_id}.json"

    def write_record(self, record: dict[str, Any]) -> None:
        atomic_write_json(self.record_path(record["run_id"]), record)

    def is_done(self, run_id: str) -> bool:
        record = self.last_record(run_id)
        return record is not None and record.get("status") in DONE_STATUSES

    def last_record(self, run_id: str) -> dict[str, Any] | None:
        """The record of ``run_id``'s last attempt, unchecked (it may be about to be measured again); None where
        there is none or it cannot be read (a run is measured again then)."""
        path = self.record_path(run_id)
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict):
            raise InputError(f"{path}: not a detprof run record: not a JSON object")
        return record

    def records(self) -> Iterator[dict[str, Any]]:
        """Every run record, each checked for the fields its readers rely on (``records.checked``)."""
        runs = self.dir / "runs"
        if not runs.is_dir():
            return
        for path in sorted(runs.glob("*.json")):
            record = read_json_object(path, "run record")
            yield checked(self.kind, record, path)

    def write_table(self, name: str, frame: pd.DataFrame) -> str:
        """Store a table as Parquet; returns its path relative to the study folder."""
        rel = f"tables/{name}.parquet"
        buffer = io.BytesIO()
        frame.to_parquet(buffer, index=False)
        atomic_write_bytes(self.dir / rel, buffer.getvalue())
        return rel

    def read_table(self, rel: str) -> pd.DataFrame:
        import pandas as pd

        path = self.dir / rel
        try:
            return pd.read_parquet(path)
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: unreadable table ({exc})") from exc

    def write_json(self, name: str, obj: Any) -> Path:
        path = self.dir / name
        atomic_write_json(path, obj)
        return path


NAMED_SUBJECTS = 3
"""How many of a study's models (or ops) name the folder of its own (``place_for``); the rest are counted."""


def place_for(base: Path, kind: StudyKind, config: dict[str, Any], subjects: Sequence[str]) -> Path:
    """The results directory a study of ``config`` goes to when no ``--out`` names one.

    ``base`` (the day's folder for the device and backend) where its ``kind`` folder is free or holds this
    configuration; else a folder of its own under ``base``, named for what it studies (``subjects``: its models,
    program or ops), with the configuration's hash added where that name holds yet another. A user who tries one
    model after another keeps every study, ``--resume`` finds each again by its configuration, and ``detprof
    report`` of ``base`` reads them all.
    """
    digest = config_hash(config)
    shown = "-".join(subjects[:NAMED_SUBJECTS])
    name = shown if len(subjects) <= NAMED_SUBJECTS else f"{shown}-and-{len(subjects) - NAMED_SUBJECTS}-more"
    places = (base, base / name, base / f"{name}-{digest[:8]}")
    for place in places[:-1]:
        store = ResultsStore(place, kind)
        if not store.exists() or store.manifest().get("config_hash") == digest:
            return place
    return places[-1]


def find_studies(path: Path, max_depth: int = 4) -> list[ResultsStore]:
    """Every study at or below a results directory, nearest first.

    A sweep run with ``--stability`` keeps one stability study per model in sub-folders, a study of another
    configuration on the same day has a folder of its own in the day's (``place_for``), and a user may point at a
    folder holding several results directories; all are found.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such results directory")
    found: list[ResultsStore] = []
    for depth in range(max_depth + 1):
        for manifest in sorted(path.glob("/".join(["*"] * depth + ["manifest.json"]))):
            if manifest.parent.name not in study_kinds.KINDS:
                continue
            kind = read_json_object(manifest, "manifest").get("kind")
            if kind == manifest.parent.name:
                found.append(ResultsStore(manifest.parent.parent, kind))
    if not found:
        folders = ", ".join(f"{name}/" for name in study_kinds.KINDS)
        raise InputError(f"{path}: no detprof results here (no manifest in {folders})")
    return found
