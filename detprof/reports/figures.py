"""The report's charts, as plotly figures built from the report data.

Plotly draws text (tick labels, hover text, legends) as its own small HTML dialect, so a
kernel name such as ``Kernel<float>&`` would lose its ``<float>`` as an unknown tag.
Every string that comes from results goes through ``text`` (``html.escape``): plotly
decodes the entities back and shows the name literally. A device is named as the report
names it (``Report.where``: its label, and its Keras backend where the report names backends),
which the caller passes in as ``shown``.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from detprof.analysis.layers import TOP_N as TOP_PARTS
from detprof.analysis.layers import PartCost
from detprof.analysis.verification import ModelVerification
from detprof.determinism import MODES
from detprof.intervals import CHEAP_OVERHEAD, Overhead
from detprof.reports.knobs_data import KnobReading
from detprof.reports.published import ReferenceRow
from detprof.reports.report_data import KernelSizePoint, StabilityStudy, SweepStudy
from detprof.reports.tradeoff import NOISY_CHURN, TradeoffPoint
from detprof.study_kinds import Where
from detprof.traces.classify import CATEGORIES

TEMPLATE = "plotly_white"
HEIGHT = 420
CATEGORY_COLORS = dict(
    zip(
        CATEGORIES,
        (
            "#1f77b4",
            "#aec7e8",
            "#ff7f0e",
            "#2ca02c",
            "#98df8a",
            "#d62728",
            "#9467bd",
            "#c5b0d5",
            "#8c564b",
            "#ffbb78",
            "#e377c2",
            "#7f7f7f",
            "#17becf",
            "#bcbd22",
        ),
        strict=True,
    )
)


def text(value: Any) -> str:
    return html.escape(str(value))


def _interval(o: Overhead) -> str:
    if o.n < 2 or math.isnan(o.ci_low):
        return f"{o.ratio:.3f}x (n={o.n}, no CI)"
    return f"{o.ratio:.3f}x [{o.ci_low:.3f}, {o.ci_high:.3f}] (n={o.n})"


def _errors(overheads: Sequence[Overhead | None]) -> dict[str, Any]:
    """Asymmetric 95% CI bars; none for a missing overhead or a single repeat."""
    plus, minus = [], []
    for o in overheads:
        if o is None or o.n < 2 or math.isnan(o.ci_low):
            plus.append(None)
            minus.append(None)
        else:
            plus.append(o.ci_high - o.ratio)
            minus.append(o.ratio - o.ci_low)
    return {"type": "data", "array": plus, "arrayminus": minus, "visible": True}


def _ratio_range(overheads: Sequence[Overhead | None]) -> list[float]:
    """Room for every estimate and most of its interval; a wild interval is clipped, the table has it."""
    points = [o.ratio for o in overheads if o is not None]
    highs = [o.ci_high for o in overheads if o is not None and o.n >= 2 and not math.isnan(o.ci_high)]
    top = max([1.2, *(1.25 * p for p in points)])
    if highs and points:
        top = max(top, min(max(highs), 2.5 * max(points)) * 1.05)
    return [0, top]


def overhead_figure(sweep: SweepStudy, shown: str) -> go.Figure:
    models = [text(m.model) for m in sweep.models]
    fig = go.Figure()
    for metric, color in (("kernel", "#1f77b4"), ("wall", "#ff7f0e")):
        values = [getattr(m, metric) for m in sweep.models]
        fig.add_bar(
            name=f"{metric} time",
            x=models,
            y=[None if o is None else o.ratio for o in values],
            error_y=_errors(values),
            marker_color=color,
            hovertext=[
                f"{name}<br>{metric} time: {'not measured' if o is None else _interval(o)}"
                for name, o in zip(models, values, strict=True)
            ],
            hoverinfo="text",
        )
    for m, name in zip(sweep.models, models, strict=True):
        if m.unsupported_reason or m.headline is None:
            fig.add_annotation(
                x=name,
                y=1,
                text="not supported" if m.unsupported_reason else "no result",
                showarrow=False,
                textangle=-90,
                yanchor="bottom",
                font={"color": "#b00020"},
            )
    return _grouped_overheads(
        fig,
        f"Overhead of determinism on {text(shown)} (deterministic / default, 95% CI)",
        [o for m in sweep.models for o in (m.kernel, m.wall)],
        legend={"orientation": "h", "y": -0.25},
    )


def backends_figure(shown: str, sweeps: Sequence[SweepStudy]) -> go.Figure:
    """One device's headline overhead per model, one bar per Keras backend: the backends side by side.

    Each bar is the overhead its row in the first screen reads its verdict from (kernel time
    where traced, else wall time); the hover text says which.
    """
    models = list(dict.fromkeys(m.model for s in sweeps for m in s.models))
    fig = go.Figure()
    overheads: list[Overhead | None] = []
    for sweep in sweeps:
        costs = {m.model: m for m in sweep.models}
        values = [costs[m].headline if m in costs else None for m in models]
        overheads += values
        hover = [
            f"{text(m)} on {text(sweep.backend)}<br>"
            + ("not measured" if o is None else f"{costs[m].headline_metric} time: {_interval(o)}")
            for m, o in zip(models, values, strict=True)
        ]
        fig.add_bar(
            name=text(sweep.backend),
            x=[text(m) for m in models],
            y=[None if o is None else o.ratio for o in values],
            error_y=_errors(values),
            hovertext=hover,
            hoverinfo="text",
        )
    return _grouped_overheads(
        fig,
        f"Overhead of determinism on {text(shown)}, per Keras backend (deterministic / default, 95% CI)",
        overheads,
        legend={"orientation": "h", "y": -0.25, "title": {"text": "backend: "}},
    )


def _grouped_overheads(
    fig: go.Figure, title: str, overheads: Sequence[Overhead | None], *, legend: dict[str, Any]
) -> go.Figure:
    """The frame every grouped overhead bar chart shares: the no-overhead line, a ratio axis that fits ``overheads``."""
    fig.add_hline(y=1, line_dash="dot", line_color="#555", annotation_text="no overhead")
    fig.update_layout(
        template=TEMPLATE,
        height=HEIGHT,
        barmode="group",
        title=title,
        yaxis={"title": "ratio (x)", "range": _ratio_range(overheads)},
        legend=legend,
        margin={"t": 60, "b": 40},
    )
    return fig


def kernel_size_figure(
    points: Sequence[KernelSizePoint], references: Sequence[ReferenceRow], *, every_paper_gpu: bool = False
) -> go.Figure:
    """The paper's Figure 8b: medium CNN overhead against kernel size, published ends beside it.

    The x axis covers the kernel sizes measured, and a published end is drawn only at a size
    that was measured, so a sweep of 3x3 alone is not stretched to 1..7. A published GPU's ends are
    drawn where a measured device is that GPU, or, with ``every_paper_gpu`` (a GPU report's first
    screen), for each of the paper's GPUs, so that another GPU's curve is read against all of them.
    """
    sizes = sorted({p.kernel_size for p in points})
    fig = go.Figure()
    for device, source in dict.fromkeys((p.device, p.source) for p in points):
        mine = [p for p in points if p.device == device and p.source == source]
        what = "whole step" if source == "sweep" else "convolutions alone, kernels_bench"
        fig.add_scatter(
            name=f"{text(device)}: {what} ({mine[0].metric} time)",
            x=[p.kernel_size for p in mine],
            y=[p.overhead.ratio for p in mine],
            error_y=_errors([p.overhead for p in mine]),
            mode="lines+markers",
            hovertext=[f"{text(device)}: {p.kernel_size}x{p.kernel_size}: {_interval(p.overhead)}" for p in mine],
            hoverinfo="text",
        )
    published = []
    for row in references:
        drawn = row.device is not None or every_paper_gpu
        if row.figure.kind == "kernel-size" and drawn and row.figure.high is not None:
            ends = [(k, v) for k, v in ((1, row.figure.low), (7, row.figure.high)) if k in sizes]
            if not ends:
                continue
            published += [v for _, v in ends]
            fig.add_scatter(
                name=f"published, {row.figure.gpu.upper()} (Zhuang et al.)",
                x=[k for k, _ in ends],
                y=[v for _, v in ends],
                mode="lines+markers",
                line={"dash": "dash"},
                marker={"symbol": "diamond", "size": 10},
                hovertext=[f"published {row.figure.gpu.upper()}, {k}x{k}: {v:.0%}" for k, v in ends],
                hoverinfo="text",
            )
    y_range = _ratio_range([p.overhead for p in points])
    if published:
        y_range[1] = max(y_range[1], max(published) * 1.1)
    fig.update_layout(
        template=TEMPLATE,
        height=HEIGHT,
        title="Medium CNN: overhead of determinism against convolution kernel size",
        xaxis={
            "title": "kernel size (k x k)",
            "tickmode": "array",
            "tickvals": sizes,
            "ticktext": [f"{k}x{k}" for k in sizes],
            "range": [min(sizes) - 1, max(sizes) + 1],
        },
        yaxis={"title": "deterministic / default", "range": y_range},
        showlegend=True,
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def category_figure(sweep: SweepStudy, shown: str) -> go.Figure:
    """Kernel time per step by category, one stacked bar per model and mode."""
    costs = [m for m in sweep.models if m.categories]
    x = [
        [text(m.model) for m in costs for mode in MODES if mode in m.categories],
        [mode for m in costs for mode in MODES if mode in m.categories],
    ]
    pairs = [(m, mode) for m in costs for mode in MODES if mode in m.categories]
    fig = go.Figure()
    for category in CATEGORIES:
        values = [m.categories[mode].get(category, 0.0) / 1e6 for m, mode in pairs]
        if not any(values):
            continue
        hover = []
        for (m, mode), v in zip(pairs, values, strict=True):
            total = sum(m.categories[mode].values()) / 1e6
            top = m.category_top[mode].get(category)
            line = f"{text(m.model)} {mode}<br>{category}: {v:.3f} ms/step ({v / total:.0%})" if total else ""
            hover.append(line + (f"<br>largest: {text(top)}" if top else ""))
        fig.add_bar(
            name=category, x=x, y=values, marker_color=CATEGORY_COLORS[category], hovertext=hover, hoverinfo="text"
        )
    fig.update_layout(
        template=TEMPLATE,
        height=HEIGHT + 60,
        barmode="stack",
        title=f"Kernel time per step by kind of work on {text(shown)}",
        yaxis={"title": "ms per step"},
        legend={"orientation": "h", "y": -0.3},
    )
    return fig


def per_class_figure(study: StabilityStudy, shown: str) -> go.Figure | None:
    """Std of each class's accuracy across runs, per variant; None when no variant has one."""
    fig = go.Figure()
    for v in study.variants:
        stds = (v.get("per_class") or {}).get("stds") or []
        if not any(s is not None and math.isfinite(s) for s in stds):
            continue
        fig.add_bar(
            name=text(v["variant"]),
            x=[str(i) for i in range(len(stds))],
            y=stds,
            hovertext=[
                f"{text(v['variant'])}, class {i}: std {s:.4f}" if s is not None else "" for i, s in enumerate(stds)
            ],
            hoverinfo="text",
        )
    if not fig.data:
        return None
    fig.update_layout(
        template=TEMPLATE,
        height=HEIGHT - 40,
        barmode="group",
        title=f"Per-class accuracy std across runs: {text(study.model)} on {text(study.dataset)}, {text(shown)}",
        xaxis={"title": "class", "type": "category"},
        yaxis={"title": "std of class accuracy"},
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


QUADRANT_CORNERS = (
    (0.01, 0.99, "left", "top", "cheap and worth it"),
    (0.99, 0.99, "right", "top", "expensive but buys a lot"),
    (0.01, 0.01, "left", "bottom", "cheap and buys little"),
    (0.99, 0.01, "right", "bottom", "expensive and buys little"),
)
POINT_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")


def _label(p: TradeoffPoint, where: Where) -> str:
    """One point's name, in the legend and its hover text (never drawn on the plot, so never overlapping)."""
    return f"{text(p.model)} on {text(where(p.device, p.backend))}"


def _marker(p: TradeoffPoint, index: int) -> dict[str, Any]:
    """Filled when the cost is settled, open when its interval lies across the cheap line."""
    settled = p.quadrant != "not settled" and p.cost.overhead.has_interval
    color = POINT_COLORS[index % len(POINT_COLORS)]
    return {"color": color, "size": 12, "symbol": "circle" if settled else "circle-open", "line": {"width": 2}}


def _churn_panel(fig: go.Figure, points: Sequence[tuple[int, TradeoffPoint]], names: Sequence[str], col: int) -> None:
    """Cost against churn under ``impl``, with the two threshold lines and the quadrants named."""
    for index, p in points:
        fig.add_scatter(
            x=[p.cost.overhead.ratio],
            y=[(p.noise.churn_impl or 0.0) * 100],
            error_x=_errors([p.cost.overhead]),
            mode="markers",
            marker=_marker(p, index),
            name=names[index],
            legendgroup=names[index],
            hovertext=[f"{names[index]}<br>{_interval(p.cost.overhead)}<br>{text(p.quadrant or '')}"],
            hoverinfo="text",
            showlegend=True,
            row=1,
            col=col,
        )
    fig.add_vline(x=CHEAP_OVERHEAD, line_dash="dot", line_color="#555", row=1, col=col)
    fig.add_hline(y=NOISY_CHURN * 100, line_dash="dot", line_color="#555", row=1, col=col)
    axis = "" if col == 1 else str(col)
    for x, y, xanchor, yanchor, label in QUADRANT_CORNERS:
        fig.add_annotation(
            x=x,
            y=y,
            xref=f"x{axis} domain",
            yref=f"y{axis} domain",
            xanchor=xanchor,
            yanchor=yanchor,
            text=label,
            showarrow=False,
            font={"color": "#999", "size": 10},
        )
    # Room below 0 and above the highest point, so that the quadrant names in the corners never sit on a point.
    top = max([2 * NOISY_CHURN * 100, *((p.noise.churn_impl or 0.0) * 125 for _, p in points)])
    fig.update_yaxes(title_text="churn under impl (%)", range=[-0.14 * top, 1.1 * top], row=1, col=col)


def _drop_panel(
    fig: go.Figure, points: Sequence[tuple[int, TradeoffPoint]], names: Sequence[str], col: int, legend: bool
) -> None:
    for index, p in points:
        se = p.noise.std_drop_se
        fig.add_scatter(
            x=[p.cost.overhead.ratio],
            y=[(p.noise.std_drop or 0.0) * 100],
            error_x=_errors([p.cost.overhead]),
            error_y={"type": "data", "array": [None if se is None else se * 100]},
            mode="markers",
            marker=_marker(p, index),
            name=names[index],
            legendgroup=names[index],
            hovertext=[
                f"{names[index]}<br>{_interval(p.cost.overhead)}<br>std drop {(p.noise.std_drop or 0) * 100:+.2f} pp"
            ],
            hoverinfo="text",
            showlegend=legend,
            row=1,
            col=col,
        )
    fig.add_vline(x=CHEAP_OVERHEAD, line_dash="dot", line_color="#555", row=1, col=col)
    fig.add_hline(y=0, line_dash="dot", line_color="#555", row=1, col=col)
    fig.update_yaxes(title_text="percentage points", row=1, col=col)


def _cost_range(points: Sequence[TradeoffPoint]) -> list[float]:
    """Every estimate, the cheap line and the intervals (a wild interval is clipped; the table has it)."""
    overheads = [p.cost.overhead for p in points]
    ratios = [o.ratio for o in overheads]
    ends = [e for o in overheads if o.has_interval for e in (o.ci_low, o.ci_high)]
    low = min([*ratios, *ends, 1.0, CHEAP_OVERHEAD])
    high = min(max([*ratios, *ends, CHEAP_OVERHEAD]), 2.5 * max([*ratios, CHEAP_OVERHEAD]))
    pad = 0.08 * (high - low)
    return [max(0.0, low - pad), high + pad]


def tradeoff_figure(points: Sequence[TradeoffPoint], where: Where) -> go.Figure | None:
    """Cost against churn under ``impl`` and against the accuracy-std drop; a panel only where there is data.

    One trace per point, named in the legend (model on device) and in its hover text, with
    the same colour in both panels: no text is drawn next to a point, so no two labels can
    collide however close the points are.
    """
    numbered = list(enumerate(points))
    names = [_label(p, where) for p in points]
    churn = [(i, p) for i, p in numbered if p.noise.churn_impl is not None]
    drop = [(i, p) for i, p in numbered if p.noise.std_drop is not None]
    panels = [
        (title, kind, mine)
        for title, kind, mine in (
            ("churn under impl (predictions that flip between identical runs)", "churn", churn),
            ("drop in accuracy std, algo+impl -> algo (+/- s.e.)", "drop", drop),
        )
        if mine
    ]
    if not panels:
        return None
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[t for t, _, _ in panels], horizontal_spacing=0.12)
    for col, (_, kind, mine) in enumerate(panels, start=1):
        if kind == "churn":
            _churn_panel(fig, mine, names, col)
        else:
            _drop_panel(fig, mine, names, col, legend=not churn)
    fig.update_xaxes(title_text="overhead of determinism (x)", range=_cost_range(points))
    fig.update_layout(
        template=TEMPLATE,
        height=HEIGHT + 60,
        title="What determinism costs against what it buys (open marker: cost not settled)",
        legend={"orientation": "h", "y": -0.22, "title": {"text": "model on device: "}},
        margin={"t": 110},
    )
    return fig


DEPTH_COLORS = "Viridis"
"""Layers coloured by depth, the first dark, the last light: how far into the model a difference has spread."""
DEPTH_COLOR_END = 0.85
"""Where on the colour scale the last layer sits: its lightest end is too light to read on white."""
STEP_TICKS = 10
"""At most about this many step numbers on the x axis, each a whole step."""


def divergence_figure(v: ModelVerification, shown: str) -> go.Figure:
    """How the two default-mode runs part, layer by layer: the largest difference of each layer's output by step.

    One line per layer in model order, coloured by depth, on a log scale (differences start
    at a rounding error's size and grow by orders of magnitude). A layer whose output is still
    identical at a step has no point there (a log scale has no zero), and one identical at
    every step is listed, greyed, in the legend only: the layers a difference has not reached.
    """
    growth = v.comparisons["default"].growth
    steps = v.comparisons["default"].steps
    colors = sample_colorscale(DEPTH_COLORS, len(growth), low=0.0, high=DEPTH_COLOR_END) if growth else []
    fig = go.Figure()
    for index, ((layer, differences), color) in enumerate(zip(growth.items(), colors, strict=True)):
        points = [d if math.isfinite(d) and d > 0 else None for d in differences]
        reached = any(p is not None for p in points)
        name = text(layer) if reached else f"{text(layer)} (identical)"
        fig.add_scatter(
            name=name,
            x=list(range(len(points))),
            y=points,
            mode="lines+markers",
            line={"color": color},
            visible=True if reached else "legendonly",
            hovertext=[
                f"{text(layer)} (layer {index + 1} of {len(growth)}), step {step}: "
                + ("identical" if d == 0 else f"max |diff| {d:.3g}")
                for step, d in enumerate(differences)
            ],
            hoverinfo="text",
        )
    fig.update_layout(
        template=TEMPLATE,
        height=HEIGHT,
        title=f"Default mode, {text(v.model)} on {text(shown)}: largest difference of each layer's output between "
        "the two runs",
        xaxis={"title": "training step", "tickmode": "linear", "dtick": max(1, math.ceil(steps / STEP_TICKS))},
        yaxis={"title": "max |difference| (log)", "type": "log", "exponentformat": "power"},
        legend={"title": {"text": "layer, in model order"}},
    )
    return fig


NO_COST = 1.0


def _around(overheads: Sequence[Overhead | None]) -> list[float]:
    """Every estimate, its interval and 1.00 with a margin: knobs' costs are small, and a range from 0 flattens them
    (a wild interval is clipped at three times the widest estimate's distance from 1.00; the table has it)."""
    ratios = [o.ratio for o in overheads if o is not None]
    reach = 3 * max([abs(r - NO_COST) for r in ratios] + [0.01])
    ends = [e for o in overheads if o is not None and o.has_interval for e in (o.ci_low, o.ci_high)]
    low = max(min([NO_COST, *ratios, *ends]), NO_COST - reach)
    high = min(max([NO_COST, *ratios, *ends]), NO_COST + reach)
    pad = 0.08 * (high - low)
    return [low - pad, high + pad]


KNOB_BAR_HEIGHT = 34
"""Pixels per bar of the knob chart: its height grows with the knobs measured, so a short one stays short."""


def knobs_figure(k: KnobReading, shown: str) -> go.Figure | None:
    """Each measured knob's two costs as horizontal bars with 95% CI whiskers, full determinism's total and its
    interval as a line and a band behind them; None where no knob was measured (none applies on this device)."""
    measured = [knob for knob in k.knobs.knobs if knob.add_one is not None or knob.leave_one_out is not None]
    if not measured:
        return None
    names = [text(knob.knob) for knob in reversed(measured)]
    fig = go.Figure()
    total = k.knobs.total
    if total is not None:
        if total.has_interval:
            fig.add_vrect(x0=total.ci_low, x1=total.ci_high, fillcolor="#7f7f7f", opacity=0.12, line_width=0)
        fig.add_vline(
            x=total.ratio,
            line_color="#555",
            annotation_text=f"full determinism {total.ratio:.3f}x",
            annotation_position="top",
        )
    for name, attr, color in (
        ("added to the default alone", "add_one", "#1f77b4"),
        ("within full determinism", "leave_one_out", "#ff7f0e"),
    ):
        values: list[Overhead | None] = [getattr(knob, attr) for knob in reversed(measured)]
        fig.add_bar(
            name=name,
            y=names,
            x=[None if o is None else o.ratio - NO_COST for o in values],
            base=NO_COST,
            error_x=_errors(values),
            orientation="h",
            marker_color=color,
            hovertext=[
                f"{knob}, {name}: {'not measured' if o is None else _interval(o)}"
                for knob, o in zip(names, values, strict=True)
            ],
            hoverinfo="text",
        )
    overheads = [total, *(o for knob in measured for o in (knob.add_one, knob.leave_one_out))]
    fig.add_vline(x=NO_COST, line_dash="dot", line_color="#555")
    fig.update_layout(
        template=TEMPLATE,
        height=180 + KNOB_BAR_HEIGHT * 2 * len(measured),
        barmode="group",
        title=f"What each switch costs: {text(k.knobs.model)} on {text(shown)} (ratio, 95% CI; line and grey band: "
        "full determinism)",
        xaxis={"title": "ratio (x); each bar starts at 1.00, no cost", "range": _around(overheads)},
        legend={"orientation": "h", "y": -0.3},
        margin={"t": 50, "b": 40, "l": 10},
    )
    fig.update_yaxes(automargin=True)
    return fig


PART_BAR_HEIGHT = 22


def parts_figure(parts: Sequence[PartCost], order: Sequence[str], what: str, title: str) -> go.Figure | None:
    """The leaderboard as horizontal bars of added ms per step with 95% CI whiskers, the largest on top; bars
    within noise in grey. With ``order`` (the model's layers), a button lays the same bars out in model order."""
    shown = list(parts[:TOP_PARTS])
    if not shown:
        return None
    names = [text(p.name) for p in shown]
    fig = go.Figure(
        go.Bar(
            y=names,
            x=[p.added_ms for p in shown],
            error_x={
                "type": "data",
                "symmetric": False,
                "array": [0.0 if math.isnan(p.hi) else p.hi - p.added_ms for p in shown],
                "arrayminus": [0.0 if math.isnan(p.lo) else p.added_ms - p.lo for p in shown],
            },
            orientation="h",
            marker_color=["#bbbbbb" if p.within_noise else "#d62728" for p in shown],
            hovertext=[
                f"{name}: {p.added_ms:+.3f} ms per step [{p.lo:+.3f}, {p.hi:+.3f}]"
                + (" (within noise)" if p.within_noise else "")
                for name, p in zip(names, shown, strict=True)
            ],
            hoverinfo="text",
        )
    )
    by_cost = {"yaxis.categoryorder": "array", "yaxis.categoryarray": list(reversed(names))}
    in_model = [text(name) for name in order if text(name) in names]
    in_model += [name for name in names if name not in in_model]
    buttons = [{"label": "by added time", "method": "relayout", "args": [by_cost]}]
    if order:
        model_order = {"yaxis.categoryorder": "array", "yaxis.categoryarray": list(reversed(in_model))}
        buttons.append({"label": "in model order", "method": "relayout", "args": [model_order]})
    fig.add_vline(x=0, line_dash="dot", line_color="#555")
    fig.update_layout(
        template=TEMPLATE,
        height=140 + PART_BAR_HEIGHT * len(shown),
        title=title,
        xaxis={"title": f"time determinism adds per step (ms), per {what}; grey: within noise"},
        yaxis={"categoryorder": "array", "categoryarray": list(reversed(names)), "automargin": True},
        updatemenus=[
            {
                "type": "buttons",
                "direction": "right",
                "x": 1,
                "xanchor": "right",
                "y": 1.02,
                "yanchor": "bottom",
                "buttons": buttons,
            }
        ]
        if len(buttons) > 1
        else [],
        showlegend=False,
        margin={"l": 10, "r": 10, "t": 70, "b": 40},
    )
    return fig
