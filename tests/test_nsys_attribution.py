"""nsys attribution: each kernel's op and layer from the NVTX ranges around the runtime call that launched it.

The real CloverLeaf export has every kernel's runtime call but no NVTX; the tests add NVTX
ranges, with nsys's own table layout, around chosen calls of a copy, the way a detprof worker
(layer ranges), PyTorch's ``emit_nvtx`` and TensorFlow push them, and compute what each kernel
should get from the inserted ranges with a plain scan, not the parser's stack walk.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from fixtures_traces import NVTX_COLUMNS, SHARED_TRACES, _create, _insert, real_traces

from detprof.errors import InputError
from detprof.traces.attribution import by_part, layer_of, layer_path
from detprof.traces.parsers import load_trace
from detprof.traces.parsers.nsys_ops import RangeOp, read_range

CLOVERLEAF = SHARED_TRACES / "nsys-2024.5-cloverleaf-4xA100.sqlite"
needs_cloverleaf = real_traces(CLOVERLEAF)

PUSH_POP = 59


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("layer:conv1", RangeOp(layer="conv1")),
        ("step 3", None),
        ("XlaModule:#hlo_module=jit_train_step,program_id=3#", None),
        (
            "aten::conv2d, seq = 12, op_id = 40",
            RangeOp(op="aten::conv2d", kind="aten::conv2d", sequence=12, forward_sequence=12),
        ),
        (
            "ConvolutionBackward0, seq = 30, stashed seq = 12",
            RangeOp(op="ConvolutionBackward0", kind="ConvolutionBackward0", sequence=30, forward_sequence=12),
        ),
        ("Conv2D: model/conv1/Conv2D", RangeOp(op="Conv2D", kind="Conv2D", path="model/conv1/Conv2D")),
        ("model/conv1/Conv2D:Conv2D", RangeOp(op="Conv2D", kind="Conv2D", path="model/conv1/Conv2D")),
        (
            "Thunk:#name=transpose(jvp(conv1))/conv_general_dilated[window=(3, 3)],hlo_op=fusion.3#",
            RangeOp(
                op="transpose(jvp(conv1))/conv_general_dilated[window=(3, 3)]",
                kind="conv_general_dilated[window=(3, 3)]",
                path="transpose(jvp(conv1))/conv_general_dilated[window=(3, 3)]",
            ),
        ),
        ("Thunk:#hlo_op=copy.7#", RangeOp(op="copy.7", kind="copy.7")),
        ("model/conv1/Conv2D:Conv2D#id=4,step_num=2#", RangeOp(op="Conv2D", kind="Conv2D", path="model/conv1/Conv2D")),
        ("XlaModule:#prefix=jit(train_step),hlo_module=jit_train_step,program_id=5#", None),
        ("ncclAllReduce", RangeOp(op="ncclAllReduce", kind="ncclAllReduce")),
    ],
)
def test_range_texts(text: str, said: RangeOp | None) -> None:
    assert read_range(text) == said


def _calls(path: Path) -> pd.DataFrame:
    """The runtime calls that launched a kernel, in time order, with the kernels' row ids."""
    with sqlite3.connect(path) as conn:
        return pd.read_sql(
            "SELECT k.rowid AS kernel, r.globalTid AS thread, r.start FROM CUPTI_ACTIVITY_KIND_KERNEL AS k "
            "JOIN CUPTI_ACTIVITY_KIND_RUNTIME AS r ON r.correlationId = k.correlationId ORDER BY r.start, k.rowid",
            conn,
        )


def _ranges(calls: pd.DataFrame) -> list[dict[str, object]]:
    """Ranges as a PyTorch worker under nsys pushes them for a two-layer model, then a TensorFlow-style op, around
    the first launching calls: a forward op in a layer, its backward node (outside every layer) naming the same
    sequence number, and op ranges with a name path."""
    starts = sorted(set(calls["start"].tolist()))
    thread = int(calls["thread"].iloc[0])

    def around(first: int, last: int, text: str) -> dict[str, object]:
        return {
            "start": starts[first] - 10,
            "end": starts[last] + 10,
            "eventType": PUSH_POP,
            "text": text,
            "globalTid": thread,
        }

    return [
        around(0, 60, "step 0"),
        around(0, 9, "layer:model"),
        around(0, 4, "layer:conv1"),
        around(0, 3, "aten::conv2d, seq = 12, op_id = 40"),
        around(1, 2, "aten::cudnn_convolution, op_id = 41"),
        around(5, 9, "layer:dense"),
        around(6, 8, "aten::linear, seq = 13, op_id = 50"),
        around(12, 15, "autograd::engine::evaluate_function: ConvolutionBackward0, seq = 12"),
        around(13, 14, "aten::convolution_backward, op_id = 60"),
        around(20, 22, "Conv2D: model/conv2/Conv2D"),
        around(24, 26, "model/head/MatMul:MatMul"),
    ]


def _expected(calls: pd.DataFrame, ranges: list[dict[str, object]]) -> dict[int, tuple[object, object, object]]:
    """Per kernel row id: (op, op_type, scope) by a plain scan of the ranges holding its call."""
    forward = {12: "model/conv1", 13: "model/dense"}
    expected = {}
    for kernel, start in zip(calls["kernel"], calls["start"], strict=True):
        holding = sorted(
            (r for r in ranges if r["start"] <= start < r["end"] and r["text"] != "step 0"), key=lambda r: r["start"]
        )
        layers = "/".join(str(r["text"])[6:] for r in holding if str(r["text"]).startswith("layer:"))
        ops = [str(r["text"]) for r in holding if not str(r["text"]).startswith("layer:")]
        if not ops:
            expected[kernel] = (None, None, f"{layers}/(unattributed)" if layers else None)
            continue
        inner, outer = ops[-1].split(", ")[0], ops[0].split(", ")[0]
        if ": model/" in outer or ":MatMul" in outer:
            kind, path = ("Conv2D", "model/conv2/Conv2D") if "Conv2D" in outer else ("MatMul", "model/head/MatMul")
            expected[kernel] = (kind, kind, path)
            continue
        kind = outer.removeprefix("autograd::engine::evaluate_function: ")
        layers = layers or forward[int(ops[0].split("seq = ")[1].split(",")[0])]
        expected[kernel] = (inner, kind, f"{layers}/{kind}")
    return expected


@pytest.fixture(scope="module")
def marked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame, list[dict[str, object]]]:
    path = tmp_path_factory.mktemp("nsys") / "marked.sqlite"
    shutil.copyfile(CLOVERLEAF, path)
    calls = _calls(path)
    ranges = _ranges(calls)
    with sqlite3.connect(path) as conn:
        _create(conn, "NVTX_EVENTS", NVTX_COLUMNS)
        _insert(conn, "NVTX_EVENTS", NVTX_COLUMNS, ranges)
    return path, calls, ranges


@needs_cloverleaf
def test_kernels_take_the_op_and_layer_ranges_around_their_launching_call(marked) -> None:
    path, calls, ranges = marked
    kernels = load_trace(path).kernels
    with sqlite3.connect(path) as conn:
        rowids = [row[0] for row in conn.execute("SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid")]
        (total,) = conn.execute('SELECT sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchone()
    by_row = dict(
        zip(rowids, zip(*(kernels[c].astype(object) for c in ("op", "op_type", "scope")), strict=True), strict=True)
    )
    got = {kernel: tuple(None if pd.isna(v) else v for v in by_row[kernel]) for kernel in calls["kernel"]}
    expected = _expected(calls, ranges)
    assert got == expected
    assert {scope for _, _, scope in expected.values()} >= {
        "model/conv1/aten::conv2d",
        "model/dense/aten::linear",
        "model/conv1/ConvolutionBackward0",
        "model/conv2/Conv2D",
        "model/head/MatMul",
    }
    assert len(kernels) == len(rowids) and int(kernels["dur_ns"].sum()) == total


@needs_cloverleaf
def test_layers_and_ops_are_read_off_the_paths(marked) -> None:
    path, _, _ = marked
    table = load_trace(path)
    layers = by_part(table, "layer").kernels["name"].astype(str)
    assert {"model/conv1", "model/dense", "model/conv2", "model/head", "(unattributed)"} == set(layers)
    ops = set(by_part(table, "op").kernels["name"].astype(str))
    assert {"aten::conv2d", "ConvolutionBackward0", "Conv2D", "MatMul", "aten::linear"} <= ops
    scopes = table.kernels["scope"].dropna().astype(str)
    assert {layer_of(s, ["conv1", "dense", "conv2"]) for s in scopes} == {"conv1", "dense", "conv2", "(unattributed)"}
    assert layer_path("model/conv1/ConvolutionBackward0", ranges_only=False) == "model/conv1"


@needs_cloverleaf
def test_an_export_without_op_ranges_names_none_and_is_refused_by_part(tmp_path: Path) -> None:
    path = tmp_path / "steps-only.sqlite"
    shutil.copyfile(CLOVERLEAF, path)
    calls = _calls(path)
    with sqlite3.connect(path) as conn:
        _create(conn, "NVTX_EVENTS", NVTX_COLUMNS)
        _insert(conn, "NVTX_EVENTS", NVTX_COLUMNS, _ranges(calls)[:1])
    table = load_trace(path)
    assert table.kernels[["op", "op_type", "scope"]].isna().all().all()
    with pytest.raises(InputError, match="names no op or layer"):
        by_part(table, "layer")


MARKED_LAYERS = """
import json
import keras
import nvtx
from detprof import backends

pushed = []
annotate = nvtx.annotate


def recording(message, **kwargs):
    pushed.append((message, kwargs.get("domain")))
    return annotate(message, **kwargs)


nvtx.annotate = recording
model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, name="conv1"),
                          keras.layers.Flatten(name="flat"), keras.layers.Dense(2, name="head")])
model.compile(optimizer="sgd", loss="mse")
x, y = keras.ops.ones((2, 8, 8, 3)), keras.ops.zeros((2, 2))
stop = backends.get("torch").mark_ops_for_nvtx()
model.train_on_batch(x, y)
stop()
during = list(pushed)
model.train_on_batch(x, y)
print(json.dumps({"during": during, "after": pushed[len(during):]}))
"""


@pytest.mark.slow
def test_a_pytorch_worker_under_nsys_pushes_a_range_per_layer_call_while_capturing() -> None:
    """``nvtx.annotate`` is recorded on the way through: without nsys attached its ranges go nowhere to look."""
    done = subprocess.run(
        [sys.executable, "-c", MARKED_LAYERS],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "KERAS_BACKEND": "torch"},
        timeout=300,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    names = [name for name, _ in found["during"]]
    assert {"layer:conv1", "layer:flat", "layer:head"} <= set(names)
    assert {domain for _, domain in found["during"]} == {"detprof"}
    assert found["after"] == []
