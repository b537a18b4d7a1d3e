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


@contextlib.contextmanager
def unpacked(paths: Sequence[Path]) -> Iterator[list[Path]]:
    """``paths`` with every bundle among them unpacked into a temporary folder named as the bundle, for as long as
    the context lasts; other paths as they are."""
    with contextlib.ExitStack() as stack:
        found = []
        for path in paths:
            if not is_bundle(Path(path)):
                found.append(Path(path))
                continue
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="detprof-bundle-"))) / Path(path).stem
            _extract(Path(path), folder)
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
