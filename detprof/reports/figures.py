"""The report's charts, as plotly figures built from the report data.

Plotly draws text (tick labels, hover text, legends) as its own small HTML dialect, so a
kernel name such as ``Kernel<float>&`` would lose its ``<float>`` as an unknown tag.
Every string that comes from results goes through ``text`` (``html.escape``): plotly
decodes the entities back and shows the name literally.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from detprof.determinism import MODES
from detprof.intervals import CHEAP_OVERHEAD, Overhead
from detprof.reports.published import ReferenceRow
from detprof.reports.report_data import KernelSizePoint, StabilityStudy, SweepStudy
from detprof.reports.tradeoff import NOISY_CHURN, TradeoffPoint
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
            "#e377c2",
            "#7f7f7f",
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


def overhead_figure(sweep: SweepStudy) -> go.Figure:
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
    fig.add_hline(y=1, line_dash="dot", line_color="#555", annotation_text="no overhead")
    fig.update_layout(
        template=TEMPLATE,
        height=HEIGHT,
        barmode="group",
        title=f"Overhead of determinism on {text(sweep.label)} (deterministic / default, 95% CI)",
        yaxis={"title": "ratio (x)", "range": _ratio_range([o for m in sweep.models for o in (m.kernel, m.wall)])},
        legend={"orientation": "h", "y": -0.25},
        margin={"t": 60, "b": 40},
    )
    return fig


def kernel_size_figure(points: Sequence[KernelSizePoint], references: Sequence[ReferenceRow]) -> go.Figure:
    """The paper's Figure 8b: medium CNN overhead against kernel size, published ends beside it."""
    sizes = [p.kernel_size for p in points]
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
    for row in references:
        if row.figure.kind == "kernel-size" and row.device is not None and row.figure.high is not None:
            fig.add_scatter(
                name=f"published, {row.figure.gpu.upper()} (Zhuang et al.)",
                x=[1, 7],
                y=[row.figure.low, row.figure.high],
                mode="lines+markers",
                line={"dash": "dash"},
                marker={"symbol": "diamond"},
                hovertext=[f"published {row.figure.gpu.upper()}: {v:.0%}" for v in (row.figure.low, row.figure.high)],
                hoverinfo="text",
            )
    fig.update_layout(
        template=TEMPLATE,
        height=HEIGHT,
        title="Medium CNN: overhead of determinism against convolution kernel size",
        xaxis={
            "title": "kernel size (k x k)",
            "tickmode": "array",
            "tickvals": sorted({1, 3, 5, 7, *sizes}),
            "range": [0.5, max([7, *sizes]) + 0.5],
        },
        yaxis={"title": "deterministic / default", "range": _ratio_range([p.overhead for p in points])},
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def category_figure(sweep: SweepStudy) -> go.Figure:
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
        title=f"Kernel time per step by kind of work on {text(sweep.label)}",
        yaxis={"title": "ms per step"},
        legend={"orientation": "h", "y": -0.3},
    )
    return fig


def per_class_figure(study: StabilityStudy) -> go.Figure | None:
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
        title=f"Per-class accuracy std across runs: {text(study.model)} on {text(study.dataset)}, {text(study.device)}",
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


def _label(p: TradeoffPoint) -> str:
    return f"{text(p.model)} @ {text(p.device)}"


def _churn_panel(fig: go.Figure, points: Sequence[TradeoffPoint], col: int) -> None:
    """Cost against churn under ``impl``, with the two threshold lines and the quadrants named."""
    fig.add_scatter(
        x=[p.cost.overhead.ratio for p in points],
        y=[(p.noise.churn_impl or 0.0) * 100 for p in points],
        error_x=_errors([p.cost.overhead for p in points]),
        mode="markers+text",
        text=[_label(p) for p in points],
        textposition="top center",
        hovertext=[f"{_label(p)}<br>{text(p.quadrant or '')}" for p in points],
        hoverinfo="text",
        showlegend=False,
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
            font={"color": "#888", "size": 11},
        )
    top = max([2 * NOISY_CHURN * 100, *((p.noise.churn_impl or 0.0) * 125 for p in points)])
    fig.update_yaxes(title_text="churn under impl (%)", range=[0, top], row=1, col=col)


def _drop_panel(fig: go.Figure, points: Sequence[TradeoffPoint], col: int) -> None:
    fig.add_scatter(
        x=[p.cost.overhead.ratio for p in points],
        y=[(p.noise.std_drop or 0.0) * 100 for p in points],
        error_y={
            "type": "data",
            "array": [None if p.noise.std_drop_se is None else p.noise.std_drop_se * 100 for p in points],
        },
        mode="markers+text",
        text=[_label(p) for p in points],
        textposition="top center",
        hoverinfo="x+y",
        showlegend=False,
        row=1,
        col=col,
    )
    fig.add_vline(x=CHEAP_OVERHEAD, line_dash="dot", line_color="#555", row=1, col=col)
    fig.add_hline(y=0, line_dash="dot", line_color="#555", row=1, col=col)
    fig.update_yaxes(title_text="percentage points", row=1, col=col)


def tradeoff_figure(points: Sequence[TradeoffPoint]) -> go.Figure | None:
    """Cost against churn under ``impl`` and against the accuracy-std drop; a panel only where there is data."""
    churn = [p for p in points if p.noise.churn_impl is not None]
    drop = [p for p in points if p.noise.std_drop is not None]
    panels = [
        (title, draw, mine)
        for title, draw, mine in (
            ("churn under impl (predictions that flip between identical runs)", _churn_panel, churn),
            ("drop in accuracy std, algo+impl -> algo (+/- s.e.)", _drop_panel, drop),
        )
        if mine
    ]
    if not panels:
        return None
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[t for t, _, _ in panels], horizontal_spacing=0.12)
    for col, (_, draw, mine) in enumerate(panels, start=1):
        draw(fig, mine, col)
    ratios = [p.cost.overhead.ratio for p in points]
    fig.update_xaxes(
        title_text="overhead of determinism (x)",
        range=[min([*ratios, 0.9]) * 0.9, max([*ratios, CHEAP_OVERHEAD]) * 1.15],
    )
    fig.update_layout(
        template=TEMPLATE,
        height=HEIGHT + 60,
        title="What determinism costs against what it buys",
        margin={"t": 110},
    )
    return fig
