"""A study's results as one file: what leaves a lent GPU machine and what ``detprof report`` reads anywhere.

A bundle is a zip of a results folder (records, kernel tables, logs, the report, the machine's
description) with ``bundle.json`` at its root naming what it holds and what was left out. The
bulk a study keeps beside what a report reads (traces, a stability study's arrays of predictions,
saved weights) goes in only while the file stays within its limit, smallest first: the records,
kernel tables and fingerprints hold everything a report reads, and the bulk is most of a study's
size.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from detprof.errors import InputError
from detprof.store import find_studies

LIMIT_BYTES = 16 * 1024 * 1024
MARKER = "bundle.json"
BULK_DIRS = frozenset({"traces", "arrays"})
BULK_SUFFIXES = (".keras", ".h5")
SKIPPED_SUFFIXES = (".zip", ".partial")
"""Other bundles in the folder (an earlier window's) are not packed into this one."""


@dataclass(frozen=True)
class Bundled:
    path: Path
    size: int
    files: int
    left_out: list[str]
    """Bulk files that did not fit, by their path in the folder."""


def write(folder: Path, path: Path, limit: int = LIMIT_BYTES) -> Bundled:
    """``folder`` packed into ``path`` (written beside it and renamed, so no reader sees half a bundle)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix not in SKIPPED_SUFFIXES)
    essential, bulk = [], []
    for file in files:
        (bulk if _is_bulk(file.relative_to(folder)) else essential).append(file)
    bulk.sort(key=lambda p: p.stat().st_size)
    partial = path.with_name(f".{path.name}.partial")
    left_out: list[str] = []
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for file in essential:
            archive.write(file, file.relative_to(folder).as_posix())
        for file in bulk:
            data = file.read_bytes()
            if partial.stat().st_size + len(zlib.compress(data, 6)) + 4096 > limit:
                left_out.append(file.relative_to(folder).as_posix())
                continue
            archive.writestr(file.relative_to(folder).as_posix(), data)
        packed = len(files) - len(left_out)
        archive.writestr(MARKER, json.dumps({"folder": folder.name, "files": packed, "left_out": left_out}, indent=2))
    partial.replace(path)
    return Bundled(path, path.stat().st_size, packed, left_out)


def _is_bulk(relative: Path) -> bool:
    return not BULK_DIRS.isdisjoint(relative.parts[:-1]) or relative.name.endswith(BULK_SUFFIXES)


def is_bundle(path: Path) -> bool:
    """A file that is a zip holding ``bundle.json``: told by its content, whatever its name."""
    if not path.is_file() or not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return MARKER in archive.namelist()


def sources(path: Path) -> list[Path]:
    """What a reader reads for ``path``: a folder's results where it holds any, else the bundles it holds (a GPU
    run kept as it came back, ``reference/<gpu>-<date>/gpu-study.zip`` beside its README); any other path itself."""
    if not path.is_dir() or _holds_results(path):
        return [path]
    return [file for file in sorted(path.glob("*.zip")) if is_bundle(file)] or [path]


def _holds_results(folder: Path) -> bool:
    try:
        return bool(find_studies(folder))
    except InputError:
        return False


@contextlib.contextmanager
def unpacked(paths: Sequence[Path]) -> Iterator[list[Path]]:
    """What a reader reads for each of ``paths`` (``sources``), every bundle among them unpacked into a temporary
    folder named as the bundle, for as long as the context lasts; other paths as they are."""
    with contextlib.ExitStack() as stack:
        found = []
        for path in (source for given in paths for source in sources(Path(given))):
            if not is_bundle(path):
                found.append(path)
                continue
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="detprof-bundle-"))) / path.stem
            _extract(path, folder)
            found.append(folder)
        yield found


def _extract(path: Path, folder: Path) -> None:
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            target = (folder / name).resolve()
            if not target.is_relative_to(folder.resolve()):
                raise InputError(f"{path}: a bundle entry points outside it ({name})")
        try:
            archive.extractall(folder)
        except (zipfile.BadZipFile, OSError) as exc:
            raise InputError(f"{path}: unreadable bundle ({exc})") from exc
