"""The report as one self-contained HTML file.

Self-contained means it opens offline and makes no request of its own: the CSS is
inline, fonts are the system's, and plotly.js is written once, with the first figure
(``--plotlyjs cdn`` swaps it for plotly's CDN script tag to keep the file small). Every
figure after the first is a bare div and script.

Everything that comes from results (kernel names above all: ``Kernel<float>&``) goes
through ``html.escape`` on its way in: ``Safe`` marks the only strings that are markup,
the ones this module builds itself, so escaping is the default and never forgotten.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import pandas as pd

from detprof import formatting as f
from detprof.determinism import MODES
from detprof.reports import figures
from detprof.reports.conditions import by_mode
from detprof.reports.reference import SOURCE
from detprof.reports.report_data import SECTIONS, ModelCost, Report, StabilityStudy
from detprof.reports.tradeoff import CHEAP_OVERHEAD, NOISY_CHURN

PlotlyJs = Literal["embed", "cdn"]
PLOT_CONFIG = {"displaylogo": False, "responsive": True}

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1280px;
padding:0 1.5rem 3rem;color:#1d1d1f;line-height:1.45}
h1{margin-top:1.2rem}h2{border-bottom:2px solid #ddd;padding-bottom:.2rem;margin-top:2.4rem}
nav a{margin-right:1rem}table{border-collapse:collapse;margin:.6rem 0 1rem;font-size:.86rem}
th,td{border:1px solid #ddd;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f4f4f6}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.82rem}
pre{background:#f6f8fa;padding:.6rem;overflow-x:auto;white-space:pre-wrap;word-break:break-all}
.kname{max-width:38rem;min-width:12rem;word-break:break-all;display:-webkit-box;-webkit-line-clamp:3;-webkit-box-orient:vertical;
overflow:hidden}.kname:hover{-webkit-line-clamp:unset;overflow:visible}
.absent{color:#555;font-style:italic}.warn{color:#8a4b00}.side{display:flex;gap:1rem;flex-wrap:wrap}
.side>div{flex:1 1 36rem;min-width:0;overflow-x:auto}details{margin:.4rem 0;border:1px solid #e3e3e3;
border-radius:4px;padding:.3rem .6rem}summary{cursor:pointer}
.badge{display:inline-block;padding:.05rem .45rem;border-radius:.6rem;font-size:.78rem;color:#fff}
.badge.verified{background:#1a7f37}.badge.failed{background:#cf222e}.badge.unchecked,.badge.na{background:#6e7781}
.agree-yes{color:#1a7f37}.agree-no{color:#cf222e}
"""


class Safe(str):
    """Markup built here; every other string is escaped when it is placed in the page."""


def esc(value: Any) -> str:
    return value if isinstance(value, Safe) else html.escape(str(value))


def tag(name: str, content: Any, cls: str | None = None) -> Safe:
    attr = f' class="{html.escape(cls)}"' if cls else ""
    return Safe(f"<{name}{attr}>{esc(content)}</{name}>")


def join(parts: Iterable[Any]) -> Safe:
    return Safe("".join(esc(p) for p in parts))


def code(value: Any) -> Safe:
    return tag("code", value)


def kernel_name(name: Any) -> Safe:
    """The full name, clamped to three lines until hovered (once in the page, not twice as a title)."""
    return Safe(f'<div class="kname"><code>{html.escape(str(name))}</code></div>')


def absent(line: str) -> Safe:
    return tag("p", line, "absent")


NUMERIC = "num"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Iterable[int] = ()) -> Safe:
    """A table; the columns in ``numeric`` are right-aligned."""
    right = set(numeric)
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="{NUMERIC}">{esc(c)}</td>' if i in right else f"<td>{esc(c)}</td>" for i, c in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return Safe(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


class _Figures:
    """Renders figures in page order; only the first carries plotly.js."""

    def __init__(self, plotlyjs: PlotlyJs) -> None:
        self.plotlyjs = plotlyjs
        self.count = 0

    def __call__(self, fig: Any) -> Safe:
        import plotly.io as pio

        include: bool | str = False
        if self.count == 0:
            include = True if self.plotlyjs == "embed" else "cdn"
        self.count += 1
        return Safe(
            pio.to_html(fig, full_html=False, include_plotlyjs=include, config=PLOT_CONFIG, default_height=None)
        )


def section(section_id: str, *parts: Any) -> Safe:
    title = SECTIONS[section_id]
    return Safe(f'<section id="{section_id}"><h2>{esc(title)}</h2>{join(parts)}</section>')


def _studies(report: Report) -> Safe:
    rows: list[list[Any]] = []
    for s in report.sweeps:
        rows.append(["sweep", s.label, str(s.path), f"{s.started or '?'} .. {s.finished or '?'}", code(s.command)])
    for k in report.kernels:
        rows.append(["kernels", k.label, str(k.path), f"{k.started or '?'} .. {k.finished or '?'}", code(k.command)])
    for st in report.stability:
        rows.append(["stability", st.device, str(st.path), "", code(st.command)])
    return table(["Study", "Device", "Results", "Ran", "Command line"], rows)


def _devices(report: Report) -> Safe:
    return table(
        ["Label", "Name", "Driver", "CUDA driver", "Compute capability", "Memory", "SMs / CPUs"],
        [
            [
                label,
                d.get("name") or f.DASH,
                d.get("driver") or f.DASH,
                d.get("cuda_driver") or f.DASH,
                d.get("compute_capability") or f.DASH,
                f"{d['memory_bytes'] / 2**30:.1f} GiB" if d.get("memory_bytes") else f.DASH,
                d.get("sm_count") or d.get("cpu_count") or f.DASH,
            ]
            for label, d in report.devices.items()
        ],
    )


def _settings(report: Report) -> Safe:
    return table(
        [
            "Study",
            "Mode",
            "op determinism",
            "jit_compile (XLA, pinned)",
            "cuDNN autotune",
            "TF_DETERMINISTIC_OPS",
            "Seed",
        ],
        [
            [
                name,
                mode,
                s.get("op_determinism"),
                s.get("jit_compile"),
                s.get("cudnn_autotune"),
                s.get("deprecated_tf_deterministic_ops_env") or "unset",
                s.get("seed"),
            ]
            for name, mode, s in report.settings
        ],
    )


def header(report: Report) -> Safe:
    versions = [
        [k, ", ".join(v) + (" (differs between runs)" if len(v) > 1 else "")] for k, v in report.versions.items()
    ]
    return section(
        "header",
        tag("p", f"Generated {report.generated_at} from {', '.join(str(p) for p in report.sources)}."),
        _studies(report),
        tag("h3", "Devices"),
        _devices(report),
        tag("h3", "Software"),
        table(["Package", "Version"], versions),
        tag("h3", "Determinism settings"),
        _settings(report),
        tag(
            "p",
            "jit_compile is pinned to the same explicit value in both modes: Keras would otherwise turn XLA off "
            "under op determinism and compare XLA against non-XLA.",
        ),
    )


def overhead(report: Report, fig: _Figures) -> Safe:
    if "overhead" in report.absent:
        return section("overhead", absent(report.absent["overhead"]))
    parts: list[Any] = [
        tag(
            "p",
            "Deterministic over default time per training step, paired repeat by repeat; "
            "error bars and brackets are 95% confidence intervals over repeats.",
        )
    ]
    for s in report.sweeps:
        parts.append(tag("h3", f"{s.label}: {s.device.get('name') or ''}"))
        parts.append(fig(figures.overhead_figure(s)))
        parts.append(
            table(["Model", "Kernel time", "Wall time", "Repeats", "Note"], s.overhead_rows(), numeric=(1, 2, 3))
        )
    parts.append(tag("h3", f"Published figures ({SOURCE}): relative GPU time"))
    parts.append(
        table(
            ["GPU", "What", "Published", "Measured here (kernel time, 95% CI)", "Device", "CI reaches it"],
            [
                [
                    r.figure.gpu.upper(),
                    r.figure.subject,
                    r.figure.published,
                    r.measured,
                    r.device or f.DASH,
                    _agrees(r.agrees),
                ]
                for r in report.references
            ],
        )
    )
    return section("overhead", *parts)


def _agrees(value: bool | None) -> Safe:
    if value is None:
        return Safe(f.DASH)
    return tag("span", "yes" if value else "no", "agree-yes" if value else "agree-no")


def kernel_size(report: Report, fig: _Figures) -> Safe:
    parts: list[Any] = []
    if "kernel-size" in report.absent:
        parts.append(absent(report.absent["kernel-size"]))
    else:
        parts.append(fig(figures.kernel_size_figure(report.kernel_size, report.references)))
        parts.append(
            table(
                ["Device", "Source", "Kernel size", "Overhead", "Metric"],
                [
                    [p.device, p.source, f"{p.kernel_size}x{p.kernel_size}", f.ratio(p.overhead), p.metric]
                    for p in report.kernel_size
                ],
            )
        )
    parts.append(tag("h3", "Single operations (kernels_bench)"))
    if "kernels-bench" in report.absent:
        parts.append(absent(report.absent["kernels-bench"]))
    for k in report.kernels:
        parts.append(tag("h4", f"{k.label}: {k.device.get('name') or ''} ({k.metric} time per step)"))
        parts.append(
            table(
                [
                    "Op",
                    "Shape",
                    "Layer",
                    "Default",
                    "Deterministic",
                    "Overhead",
                    "Wall time",
                    "Kernels that differ",
                    "Note",
                ],
                [
                    [
                        r.op,
                        r.shape,
                        r.where,
                        f.duration_ns(r.default_ns),
                        f.duration_ns(r.deterministic_ns),
                        f.ratio(r.overhead),
                        f.ratio(r.wall),
                        kernel_name(r.changed) if r.changed else f.DASH,
                        r.note or "",
                    ]
                    for r in k.rows
                ],
                numeric=(3, 4),
            )
        )
    return section("kernel-size", *parts)


def top_table(frame: pd.DataFrame) -> Safe:
    return table(
        ["Time (%)", "Total / step", "Instances / step", "Avg", "Med", "Category", "Name"],
        (
            [
                f"{r.pct:.1f}",
                f.duration_ns(r.total_ns),
                f.count(r.instances),
                f.duration_ns(r.avg_ns),
                f.duration_ns(r.med_ns),
                r.category,
                kernel_name(r.name),
            ]
            for r in frame.itertuples(index=False)
        ),
        numeric=(0, 1, 2, 3, 4),
    )


def diff_table(m: ModelCost) -> Safe:
    assert m.diff is not None
    rows = [
        [
            r.status,
            r.category,
            f.duration_ns(r.total_ns_base),
            f.duration_ns(r.total_ns_other),
            f.signed_ns(r.delta_ns),
            f.percent(r.share_of_change, 0),
            f"{r.instances_base} -> {r.instances_other}",
            kernel_name(r.name),
        ]
        for r in m.diff.itertuples(index=False)
    ]
    more, delta = m.diff_rest
    note = (
        tag("p", f"... and {more} more kernels that changed, by {f.signed_ns(delta)} per step in all.") if more else ""
    )
    headers = [
        "Change",
        "Category",
        "Default / step",
        "Deterministic / step",
        "Delta",
        "Share of overhead",
        "Instances / step",
        "Name",
    ]
    return join([table(headers, rows, numeric=(2, 3, 4, 5)), note])


def model_details(m: ModelCost) -> Safe:
    summary = join([tag("strong", m.model), ": ", m.attribution or m.no_kernels or ""])
    if not m.top:
        return Safe(f"<details><summary>{summary}</summary>{absent(m.no_kernels or 'no kernel tables')}</details>")
    sides = []
    for mode in MODES:
        if mode in m.top:
            other = (
                f"other kernels: {f.duration_ns(m.other_ns.get(mode, 0.0))} per step" if m.other_ns.get(mode) else ""
            )
            sides.append(
                join(
                    [
                        Safe("<div>"),
                        tag("h4", f"{mode}: top {len(m.top[mode])} kernels"),
                        top_table(m.top[mode]),
                        tag("p", other),
                        Safe("</div>"),
                    ]
                )
            )
    body: list[Any] = [Safe('<div class="side">'), *sides, Safe("</div>")]
    if m.diff is not None:
        body += [tag("h4", "What determinism changed (largest changes first)"), diff_table(m)]
    return Safe(f"<details><summary>{summary}</summary>{join(body)}</details>")


def cost(report: Report, fig: _Figures) -> Safe:
    if "cost" in report.absent:
        return section("cost", absent(report.absent["cost"]))
    parts: list[Any] = [
        tag(
            "p",
            "Per model: the kernels of each mode (nsys-style, per training step, over all repeats) and what "
            "determinism added, removed or slowed. Open a model for its tables.",
        )
    ]
    for s in report.sweeps:
        parts.append(tag("h3", s.label))
        if any(m.categories for m in s.models):
            parts.append(fig(figures.category_figure(s)))
        parts.extend(model_details(m) for m in s.models)
    return section("cost", *parts)


def _badge(check: Any) -> Safe:
    state, line = f.check_line(check)
    return Safe(f'<span class="badge {state}">{esc(f.BADGE_LABELS[state])}</span> {esc(line)}')


def stability_study(study: StabilityStudy, fig: _Figures) -> list[Any]:
    parts: list[Any] = [
        tag(
            "h3",
            f"{study.model} on {study.dataset}, {study.device}: {study.runs_ok} runs ok, {study.runs_failed} failed",
        )
    ]
    rows = [
        [
            v.get("variant"),
            ", ".join(v.get("varies") or []) or "nothing",
            "on" if v.get("mode") == "deterministic" else "off",
            f"{v.get('runs_ok', 0)} / {v.get('runs_failed', 0)}",
            f.number((v.get("accuracy") or {}).get("mean")),
            f.plus_minus(v.get("accuracy")),
            f.number(v.get("churn")),
            f.number(v.get("l2")),
            f.number((v.get("per_class") or {}).get("ratio"), 2),
            f.number(v.get("spearman")),
            f.number(v.get("ensemble_gain")),
            f.number(v.get("cka")),
        ]
        for v in study.variants
    ]
    headers = [
        "Variant",
        "Varies",
        "Determinism",
        "Runs ok / failed",
        "Accuracy mean",
        "Accuracy std +/- s.e.",
        "Churn",
        "L2",
        "Worst class std / overall",
        "Spearman",
        "Ensemble gain",
        "CKA",
    ]
    parts.append(table(headers, rows, numeric=tuple(range(4, 12))))
    checks = [v for v in study.variants if (v.get("determinism_check") or {}).get("applicable")]
    for v in checks:
        parts.append(
            join(
                [
                    Safe("<p>Determinism check, "),
                    code(v.get("variant")),
                    ": ",
                    _badge(v.get("determinism_check")),
                    Safe("</p>"),
                ]
            )
        )
    if not checks:
        parts.append(absent("No variant that varies nothing (control) ran, so determinism was not checked."))
    chart = figures.per_class_figure(study)
    if chart is None:
        parts.append(absent("No per-class spread: every variant has fewer than 2 successful runs."))
    else:
        parts.append(fig(chart))
    groups = [(v.get("variant"), g) for v in study.variants for g in ((v.get("subgroups") or {}).get("groups") or [])]
    if groups:
        rates = [r for r in ("accuracy", "fpr", "fnr") if any(f"{r}_std" in g for _, g in groups)]
        headers = ["Variant", "Group", "n"] + [
            h for r in rates for h in (f"{r} mean", f"{r} std", f"{r} std / overall")
        ]
        parts.append(tag("h4", "Sub-groups"))
        parts.append(
            table(
                headers,
                [
                    [name, g.get("group"), g.get("n")]
                    + [
                        c
                        for r in rates
                        for c in (
                            f.number(g.get(f"{r}_mean")),
                            f.number(g.get(f"{r}_std")),
                            f.number(g.get(f"{r}_std_ratio"), 2),
                        )
                    ]
                    for name, g in groups
                ],
                numeric=tuple(range(2, 3 + 3 * len(rates))),
            )
        )
    return parts


def stability(report: Report, fig: _Figures) -> Safe:
    if "stability" in report.absent:
        return section("stability", absent(report.absent["stability"]))
    parts: list[Any] = [
        tag(
            "p",
            "Each variant trains several copies, varying only the noise sources it names; "
            "std +/- s.e. is across runs (bootstrap s.e.), churn and L2 are means over run pairs.",
        )
    ]
    for study in report.stability:
        parts += stability_study(study, fig)
    return section("stability", *parts)


def _tradeoff_chart(report: Report, fig: _Figures) -> Safe:
    chart = figures.tradeoff_figure(report.tradeoff)
    if chart is None:
        return absent(
            "No chart: no stability study here measures implementation noise "
            "(it needs the impl variant, or algo+impl and algo, with 2+ successful runs each)."
        )
    return fig(chart)


def tradeoff(report: Report, fig: _Figures) -> Safe:
    if "tradeoff" in report.absent:
        return section("tradeoff", absent(report.absent["tradeoff"]))
    rows = [
        [
            p.model,
            p.device,
            f"{f.ratio(p.cost.overhead)} ({p.cost.metric})",
            f.percent(p.noise.churn_impl, 2),
            (f"{p.noise.std_drop * 100:+.2f} pp" if p.noise.std_drop is not None else f.DASH)
            + (f" +/- {p.noise.std_drop_se * 100:.2f}" if p.noise.std_drop_se is not None else ""),
            p.reading,
        ]
        for p in report.tradeoff
    ]
    return section(
        "tradeoff",
        tag(
            "p",
            f"Readings use two documented thresholds: determinism is cheap up to {CHEAP_OVERHEAD:.2f}x; "
            f"implementation noise is worth removing from {NOISY_CHURN:.0%} churn under impl.",
        ),
        _tradeoff_chart(report, fig),
        table(["Model", "Device", "Overhead", "Churn under impl", "Accuracy std drop", "Reading"], rows),
    )


def conditions(report: Report) -> Safe:
    parts: list[Any] = []
    if "telemetry" in report.absent:
        parts.append(absent(report.absent["telemetry"]))
    for s in report.sweeps:
        if not s.clocks:
            continue
        parts.append(tag("h3", f"{s.label}: GPU during the runs (each mode over all models, then throttled models)"))
        parts.append(
            table(
                [
                    "Model",
                    "Mode",
                    "Runs",
                    "SM clock min / mean / max (MHz)",
                    "Max temperature (C)",
                    "Mean power (W)",
                    "Throttled runs",
                ],
                [
                    [
                        c.model,
                        c.mode,
                        c.runs,
                        " / ".join(f.number(v, 0) for v in (c.sm_clock_min, c.sm_clock_mean, c.sm_clock_max)),
                        f.number(c.temperature_max, 0),
                        f.number(c.power_mean, 1),
                        f"{c.throttled_runs}" + (f" ({', '.join(c.reasons)})" if c.reasons else ""),
                    ]
                    for c in [*by_mode(s.clocks), *(c for c in s.clocks if c.throttled_runs)]
                ],
                numeric=(2, 4, 5),
            )
        )
    parts.append(tag("h3", "Warnings"))
    if report.warnings:
        parts.append(Safe("<ul>" + "".join(f'<li class="warn">{esc(w)}</li>' for w in report.warnings) + "</ul>"))
    else:
        parts.append(tag("p", "None: no throttling, no failed runs, every interval narrow enough to conclude."))
    parts.append(tag("h3", "Reproduce"))
    parts.append(Safe("<pre><code>" + esc("\n".join(report.commands)) + "</code></pre>"))
    return section("conditions", *parts)


def render(report: Report, plotlyjs: PlotlyJs = "embed") -> str:
    fig = _Figures(plotlyjs)
    nav = "".join(f'<a href="#{sid}">{esc(title)}</a>' for sid, title in SECTIONS.items())
    body = join(
        [
            header(report),
            overhead(report, fig),
            kernel_size(report, fig),
            cost(report, fig),
            stability(report, fig),
            tradeoff(report, fig),
            conditions(report),
        ]
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>detprof report</title><style>{CSS}</style></head><body>"
        f"<h1>detprof: what determinism costs, where, and what it buys</h1><nav>{nav}</nav>{body}</body></html>\n"
    )
