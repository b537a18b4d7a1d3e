"""One entry point for every trace format: ``load_trace(path) -> KernelTable``.

The format is recognised from the file's content, never its name: users rename exports,
and CI artifacts arrive as ``trace.bin``. No parser needs a framework (XSpace files are read
with protobuf alone), so any trace reads on a machine with any or none installed. Each
parser is imported only in its branch so that reading a SQLite or CSV trace never pays for
another format's imports, and nothing here imports pandas: the SQLite parser starts reading
before it does. A folder is a TensorFlow or JAX profile when it holds XSpace files, else a
folder of PyTorch profiler traces (one per rank, as ``tensorboard_trace_handler`` writes them).
"""

from __future__ import annotations

import codecs
import gc
import gzip
import re
import shutil
import subprocess
import tempfile
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from detprof.errors import InputError, UsageError, last_line
from detprof.traces.parsers.signatures import GZIP_MAGIC, SQLITE_MAGIC

if TYPE_CHECKING:
    from detprof.traces.kernel_table import KernelTable

# Nsight Systems reports are a proprietary container with no documented signature, so a
# binary file that is neither SQLite nor text is taken for one only by its suffix.
NSYS_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
_SNIFF_BYTES = 64 * 1024
KNOWN_FORMATS = (
    "nsys .sqlite/.nsys-rep, nsys stats CSV, nvprof CSV, TensorFlow .xplane.pb or profile log dir, "
    "PyTorch profiler JSON (.json/.json.gz or trace dir)"
)
_NON_TEXT = re.compile(r"[\x00-\x08\x0b\x0e-\x1f]")


def load_trace(path: str | Path, rank: int | None = None) -> KernelTable:
    """Read any trace detprof knows; ``rank`` picks one rank's file of a PyTorch profiler trace folder.

    The garbage collector is off meanwhile. Reading a trace makes objects by the million (a
    Kineto trace's events) or imports pandas (a few hundred thousand objects), and none of
    them form cycles; every few hundred new containers the collector would walk all of them
    again: that doubled the time of a large Kineto trace, and cost ``detprof parse`` of an
    nsys export a tenth of its second.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _load(Path(path), rank)
    finally:
        if enabled:
            gc.enable()


def _load(trace: Path, rank: int | None) -> KernelTable:
    if not trace.exists():
        raise InputError(f"{trace}: no such file or directory")
    if trace.is_dir():
        return _load_folder(trace, rank)
    try:
        with trace.open("rb") as fh:
            head = fh.read(_SNIFF_BYTES)
    except OSError as exc:
        raise InputError(f"{trace}: cannot read ({exc.strerror or exc})") from None
    if not head:
        raise InputError(f"{trace}: empty file")
    text = _as_text(head)
    json_text = text is not None and text.lstrip().startswith(("{", "["))
    if _gzip_holds_json(trace) if head.startswith(GZIP_MAGIC) else json_text:
        return _load_kineto(trace, rank)
    if rank is not None:
        raise UsageError(f"--rank picks one rank of a PyTorch profiler trace; {trace} is not one")
    if head.startswith(SQLITE_MAGIC):
        from detprof.traces.parsers.nsys_sqlite import load_nsys_sqlite

        return load_nsys_sqlite(trace)
    if text is not None:
        return _load_text(trace, text)
    if trace.suffix.lower() in NSYS_REPORT_SUFFIXES:
        return _load_nsys_report(trace)
    from detprof.traces.parsers.tf_xplane import NotXSpaceError, load_xplane

    try:
        return load_xplane(trace)
    except NotXSpaceError:
        # The XSpace parser was the last guess, so its "not an XSpace" would wrongly suggest the
        # file was meant to be one.
        raise InputError(_not_a_trace(trace, "binary, but neither SQLite nor a TensorFlow XSpace protobuf")) from None


def _gzip_holds_json(trace: Path) -> bool:
    """A gzip file whose content starts as JSON does (a Kineto trace), or that cannot be told otherwise (truncated:
    the Kineto reader says so); else binary content (jax.profiler's ``.xplane.pb.gz``)."""
    try:
        with gzip.open(trace, "rb") as stream:
            start = stream.read(_SNIFF_BYTES)
    except (OSError, EOFError, zlib.error):
        return True
    return _as_text(start) is not None or not start


def _load_kineto(trace: Path, rank: int | None) -> KernelTable:
    from detprof.traces.parsers.kineto_json import NotKinetoError, load_kineto

    try:
        return load_kineto(trace, rank)
    except NotKinetoError as exc:
        raise InputError(_not_a_trace(trace, exc.what)) from None


def _load_folder(folder: Path, rank: int | None) -> KernelTable:
    """A framework profile of XSpace files (TensorFlow's or jax.profiler's); else the folder's PyTorch profiler
    traces."""
    from detprof.traces.parsers.kineto_json import load_kineto, trace_files
    from detprof.traces.parsers.tf_xplane import load_xplane, xplane_files

    try:
        xplane_files(folder)
    except InputError as no_xspace:
        if not trace_files(folder):
            raise InputError(f"{no_xspace}; no PyTorch profiler trace (*.json, *.json.gz) either") from None
        return load_kineto(folder, rank)
    if rank is not None:
        raise UsageError(f"--rank picks one rank of a PyTorch profiler trace folder; {folder} is a TensorFlow profile")
    return load_xplane(folder)


def _not_a_trace(trace: Path, what: str) -> str:
    """One wording for every file in no known format: what it is not, what detprof reads, what it looked like."""
    return f"{trace}: not a trace detprof reads ({KNOWN_FORMATS}); {what}"


def _as_text(head: bytes) -> str | None:
    """The sniffed head as text, or None for binary content (SQLite, protobuf, reports).

    Protobufs are often valid UTF-8, but their tags and lengths are control bytes that
    CSV and log text never contain.
    """
    try:
        text = codecs.getincrementaldecoder("utf-8-sig")().decode(head, final=False)
    except UnicodeDecodeError:
        return None
    return None if _NON_TEXT.search(text) else text


def _load_text(trace: Path, head: str) -> KernelTable:
    from detprof.traces.parsers import nsys_stats_csv, nvprof_csv

    if nsys_stats_csv.sniff(head):
        return nsys_stats_csv.load_nsys_stats_csv(trace)
    if nvprof_csv.sniff(head):
        return nvprof_csv.load_nvprof_csv(trace)
    if not head.strip():
        raise InputError(f"{trace}: empty file (only whitespace)")
    what = "text, but without an nsys stats kernel summary (cuda_gpu_kern_sum) or an nvprof CSV header"
    raise InputError(_not_a_trace(trace, what))


def _load_nsys_report(trace: Path) -> KernelTable:
    nsys = shutil.which("nsys")
    if nsys is None:
        raise InputError(
            f"{trace}: reading an Nsight Systems report needs `nsys` on PATH; install Nsight Systems "
            f"or export to SQLite with `nsys export --type sqlite {trace}` and pass the .sqlite file"
        )
    from detprof.traces.parsers.nsys_sqlite import load_nsys_sqlite

    with tempfile.TemporaryDirectory(prefix="detprof-nsys-") as tmp:
        exported = Path(tmp) / f"{trace.stem}.sqlite"
        done = subprocess.run(
            [nsys, "export", "--type", "sqlite", "--output", str(exported), str(trace)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0 or not exported.is_file():
            reason = last_line(done.stderr or done.stdout) or f"exit code {done.returncode}"
            raise InputError(f"{trace}: `nsys export --type sqlite` failed: {reason}")
        return load_nsys_sqlite(exported, source=str(trace))
