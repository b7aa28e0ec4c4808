"""``tilewise.report``: one compiled call as a single self-contained HTML page.

[Note: report] ``report(fn, *args)`` draws what ``explain`` found (it calls ``explain`` and reads its
``Explanation``: the sections, each step's record, the programs as built or lowered) on one page that opens
offline: inline CSS, one small inline script, charts as inline SVG, no fonts, no network. The page holds the
call and a summary of its programs; the graph after each pass, each marked with what the pass changed (a
line diff against the graph before it); the fused graph; every kernel's IR, schedule and source, and for
CUDA its whole PTX and SASS side by side with the lines that matter marked (tensor-core MMA, vector loads
and stores, local-memory spills); a log-log roofline chart with one point per step; a timeline of the steps;
and each program's memory plan, every arena buffer's lifetime as a bar over the steps.

A GPT training step has a few hundred kernels and each has pages of source: were they all in the DOM the
page would take seconds to open. Every collapsed block's contents therefore travel as a JSON string in an
inert ``<script type="application/json">`` and become HTML only when the block is first opened (the page
opens a block named in its URL's fragment on load). All text is HTML-escaped where it is rendered, and the
JSON is written with ``<``, ``>`` and ``&`` as ``\\u`` escapes so no source can close the script holding it.
"""

from __future__ import annotations

import difflib
import html
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from tilewise.compiler.ir import format_graph
from tilewise.compiler.lowering.memory import lifetimes, steps_of
from tilewise.fileio import atomic_write_bytes
from tilewise.profiler.explain import Explanation, StepRecord, explain, pass_texts
from tilewise.profiler.roofline import DEFAULT_SIZE, Roofline

SECTIONS = ("call", "passes", "fusion", "kernels", "roofline", "timeline", "memory")
SECTION_TITLES = {"call": "The call", "passes": "Graph passes", "fusion": "Fused graph", "kernels": "Kernels",
                  "roofline": "Roofline", "timeline": "Timeline", "memory": "Memory plan"}


def report(fn, *args, out: str | Path = "report.html", target: str | None = None, arch: str | None = None,
           repeats: int = 20, run: bool = True, roofline_size: int = DEFAULT_SIZE, name: str | None = None) -> Path:
    """Write one self-contained HTML page of ``tilewise.compile(fn)(*args)`` to ``out`` and return its path
    (see [Note: report]). The arguments are ``explain``'s: ``target`` "c" or "cuda" (a target other than the
    arguments' device's generates code without running), ``arch`` the CUDA architecture of the PTX and SASS,
    ``repeats`` the timed calls.

    >>> import tilewise as tw
    >>> tw.report(lambda x: (x + 1).relu(), tw.randn(64), out="relu.html", repeats=2)  # doctest: +SKIP
    PosixPath('relu.html')
    """
    explained = explain(fn, *args, target=target, arch=arch, repeats=repeats, run=run,
                        roofline_size=roofline_size, name=name)
    path = Path(out)
    atomic_write_bytes(path, render(explained, arch).encode("utf-8"), durable=False)
    return path


def render(explained: Explanation, arch: str | None = None) -> str:
    """The page of an ``Explanation`` as HTML text."""
    page = _Page()
    body = [_call_section(explained), _passes_section(explained, page), _fusion_section(explained, page),
            _kernels_section(explained, page, arch), _roofline_section(explained), _timeline_section(explained),
            _memory_section(explained, page)]
    title = f"tilewise report: {explained.call.splitlines()[0]}"
    nav = " ".join(f'<a href="#{s}">{SECTION_TITLES[s]}</a>' for s in SECTIONS)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_e(title)}</title>"
            f"<style>{CSS}</style></head>\n<body><header><h1>{_e(title)}</h1><nav>{nav}</nav></header>\n"
            + "\n".join(body) + "\n" + page.payloads() + f"\n<script>{SCRIPT}</script>\n</body></html>\n")


# ---------------------------------------------------------------------------- the page's parts

class _Page:
    """Collects the contents of collapsed blocks, written once at the end of the page as inert JSON."""

    def __init__(self):
        self.blocks: list[str] = []

    def lazy(self, summary: str, contents: str, key: str = "", marker: str = "") -> str:
        """A collapsed block whose ``contents`` (HTML) are made into DOM when it is first opened."""
        self.blocks.append(contents)
        ident = f"b{len(self.blocks) - 1}"
        anchor = f' id="{_e(key)}"' if key else ""
        return (f'<details class="lazy" data-lazy="{ident}"{anchor}><summary>{summary}{marker}</summary>'
                '<div class="body"></div></details>')

    def payloads(self) -> str:
        return "\n".join(f'<script type="application/json" id="b{k}">{_json(text)}</script>'
                         for k, text in enumerate(self.blocks))


def _json(text: str) -> str:
    return json.dumps(text).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _pre(text: str, cls: str = "") -> str:
    return f'<pre{f" class={chr(34)}{cls}{chr(34)}" if cls else ""}>{_e(text)}</pre>'


def _section(key: str, inner: str) -> str:
    return f'<section id="{key}"><h2>{SECTION_TITLES[key]}</h2>\n{inner}\n</section>'


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-")


# ---------------------------------------------------------------------------- the call and the programs

def _call_section(explained: Explanation) -> str:
    parts = [_pre(explained.section("the call"))]
    sections = dict(explained.sections)
    if "run" in sections:
        parts.append(f'<p class="run">{_e(sections["run"])}</p>')
    parts.append(_summary_table(explained))
    for title in ("operators", "eager"):
        if title in sections:
            parts.append(f"<details><summary>{_e(title)}</summary>{_pre(sections[title])}</details>")
    return _section("call", "\n".join(parts))


def _summary_table(explained: Explanation) -> str:
    rows = []
    for p in explained.programs:
        records = [r for r in explained.kernels if r.program == p.label]
        timed = [r.seconds for r in records if r.seconds is not None]
        count = {kind: sum(r.kind == kind for r in records) for kind in ("kernel", "library call", "copy")}
        plan = _plan_of(p)
        time_text = f"{1e3 * sum(timed):.4f} ms" if timed else "not timed"
        rows.append(f"<tr><td>{_e(p.label or 'program')}</td><td>{len(records)}</td><td>{count['kernel']}</td>"
                    f"<td>{count['library call']}</td><td>{count['copy']}</td>"
                    f"<td>{_bytes(plan.arena_bytes)}</td><td>{time_text}</td></tr>")
    head = ("<tr><th>program</th><th>steps</th><th>kernels</th><th>library calls</th><th>copies</th>"
            "<th>arena</th><th>steps together</th></tr>")
    return f'<table class="summary">{head}{"".join(rows)}</table>'


def _plan_of(p):
    return p.program.plan if p.program is not None else p.lowered.plan


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


# ---------------------------------------------------------------------------- graphs

def _passes_section(explained: Explanation, page: _Page) -> str:
    parts, shown = [], set()
    for p in explained.programs:
        if not p.passes or id(p.passes) in shown:
            continue
        shown.add(id(p.passes))
        label = p.label.replace("forward", "").replace("backward", "").strip()
        if label:
            parts.append(f"<h3>{_e(label)}</h3>")
        parts.append(_pass_history(p.passes, page, _slug(label or "graph")))
    return _section("passes", "\n".join(parts) or "<p>no pass history</p>")


def _pass_history(history: list, page: _Page, key: str) -> str:
    blocks, before = [], None
    for k, ((name, _), text) in enumerate(zip(history, pass_texts(history))):
        now = text.splitlines()
        title = _e(name if k == 0 else f"after {name}")
        if before == now:  # an unchanged graph is not repeated: it is the one above
            blocks.append(f'<p class="same">{title} <span class="tag">unchanged</span></p>')
            continue
        if before is None:
            marker, contents = f' <span class="tag">{len(now)} lines</span>', _pre("\n".join(now))
        else:
            added, removed, contents = _diff(before, now)
            marker = f' <span class="tag changed">+{added} &minus;{removed}</span>'
        blocks.append(page.lazy(title, contents, f"{key}-pass-{k}", marker))
        before = now
    return "\n".join(blocks)


def _diff(before: list[str], now: list[str]) -> tuple[int, int, str]:
    """Lines added and removed, and the new graph with them marked (removed lines shown where they were)."""
    lines, added, removed = [], 0, 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, before, now, autojunk=False).get_opcodes():
        if op == "equal":
            lines += [_e(line) for line in now[j1:j2]]
            continue
        lines += [f'<del>{_e(line)}</del>' for line in before[i1:i2]]
        lines += [f'<ins>{_e(line)}</ins>' for line in now[j1:j2]]
        added, removed = added + (j2 - j1), removed + (i2 - i1)
    return added, removed, '<pre class="diff">' + "\n".join(lines) + "</pre>"


def _fusion_section(explained: Explanation, page: _Page) -> str:
    parts = []
    for p in explained.programs:
        text = format_graph(p.fused, "after fuse")
        summary = f"{_e(p.label or 'program')}: {len(p.kernels)} generated kernel(s)"
        parts.append(page.lazy(summary, _pre(text), f"fused-{_slug(p.label or 'program')}"))
    return _section("fusion", "\n".join(parts))


# ---------------------------------------------------------------------------- kernels

HOT_SASS = (("mma", re.compile(r"\b(?:HMMA|IMMA|DMMA|HGMMA|QGMMA|IGMMA|BGMMA|WGMMA|UTC\w*MMA\w*|QMMA|OMMA)\b")),
            ("vector", re.compile(r"\b(?:LDG|STG|LDS|STS|LD|ST|LDGSTS|RED|ATOM)\.[\w.]*?(?:64|128)\b|"
                                  r"\b(?:LDGSTS|LDSM|UTMALDG|UBLKCP)\b")),
            ("spill", re.compile(r"\b(?:LDL|STL)\b")))
HOT_PTX = (("mma", re.compile(r"\b(?:mma|wgmma|tcgen05\.mma)\.")),
           ("vector", re.compile(r"\b(?:ld|st|ldu)\.[\w.]*\.v[248]\.|\bcp\.async\b|\bldmatrix\b")),
           ("spill", re.compile(r"\b(?:ld|st)\.local\b")))
HOT_NAMES = {"mma": "tensor-core MMA", "vector": "vector load/store", "spill": "local-memory spill"}


_ANY = {id(rules): re.compile("|".join(f"(?:{pattern.pattern})" for _, pattern in rules))
        for rules in (HOT_SASS, HOT_PTX)}  # one search rules out most lines


def classify(line: str, rules=HOT_SASS) -> str:
    """The kind of a PTX or SASS line worth marking ("mma", "vector", "spill"), or "" for the others."""
    any_rule = _ANY.get(id(rules))
    if any_rule is not None and not any_rule.search(line):
        return ""
    for kind, pattern in rules:
        if pattern.search(line):
            return kind
    return ""


def _kernels_section(explained: Explanation, page: _Page, arch: str | None) -> str:
    records = {(r.program, r.name): r for r in explained.kernels if r.kind == "kernel"}
    cuda = any(p.sources for p in explained.programs)
    arch = arch or (_default_arch() if cuda else None)
    parts = []
    marked: dict = {}  # kernels of one text (a transformer's layers) are marked once
    for p in explained.programs:
        parts.append(f"<h3>{_e(p.label or 'program')}: {len(p.kernels)} kernel(s)</h3>")
        code = _machine_code(p.sources, arch) if p.sources and arch is not None else {}
        for kernel, schedule in zip(p.kernels, p.schedules):
            record = records.get((p.label, kernel.name))
            parts.append(_kernel_block(p, kernel, schedule, record, page, arch, code.get(kernel.name), marked))
        source_name = "CUDA C" if p.sources else "C"
        parts.append(page.lazy(f"the whole generated {source_name} of {_e(p.label or 'the program')}",
                               _pre(p.source or "(no generated kernel)", "code")))
    return _section("kernels", "\n".join(parts))


def _default_arch() -> str:
    from tilewise.compiler.program_cuda import default_arch

    return default_arch()


def _kernel_block(p, kernel, schedule, record: StepRecord | None, page: _Page, arch: str | None, code,
                  marked: dict | None = None) -> str:
    source = p.sources.get(kernel.name) if p.sources else _c_function(p.source, kernel.name)
    parts = [f"<h4>IR</h4>{_pre(str(kernel))}", f"<h4>schedule</h4>{_pre(schedule.describe())}",
             f"<h4>source</h4>{_pre(source or '(not found in the program source)', 'code')}"]
    marker = ""
    if code is not None:
        ptx, sass, resources = code.ptx, code.sass, code.resources
        ptx_html, ptx_counts = _marked_as(ptx, HOT_PTX, kernel.name, marked)
        sass_html, sass_counts = _marked_as(sass, HOT_SASS, kernel.name, marked)
        parts.append(f'<h4>PTX and SASS ({_e(arch)})</h4><p>{_e(resources)}</p><div class="side">'
                     f'<div><h5>PTX</h5>{ptx_html}</div><div><h5>SASS</h5>{sass_html}</div></div>')
        marker = "".join(f' <span class="tag {kind}">{n} {HOT_NAMES[kind]}</span>'
                         for kind, n in sass_counts.items() if n)
    where = f"step {record.index}, " if record is not None else ""
    timing = (f"{1e3 * record.seconds:.4f} ms" if record is not None and record.seconds is not None else "not timed")
    work = f", {_bytes(record.nbytes)}, {record.flops} FLOPs" if record is not None else ""
    summary = f"<code>{_e(kernel.name)}</code> <span class=\"meta\">{where}{timing}{_e(work)}</span>"
    return page.lazy(summary, "".join(parts), f"kernel-{_slug(p.label or 'program')}-{kernel.name}", marker)


def _c_function(source: str, name: str) -> str:
    """The definition of the C function ``name`` in a whole program's source: from the line that starts it (not
    indented, unlike a call) to the closing brace on a line of its own."""
    at = source.find(f" {name}(")
    while at >= 0:
        start = source.rfind("\n", 0, at) + 1
        if not source[start].isspace():
            end = source.find("\n}\n", at)
            return source[start:end + 2 if end >= 0 else len(source)]
        at = source.find(f" {name}(", at + 1)
    return ""


def _machine_code(sources: dict[str, str], arch: str) -> dict:
    """The whole PTX and SASS of each CUDA kernel and its resource line (NVRTC and nvdisasm, no GPU needed),
    each different text compiled and disassembled once."""
    from tilewise.compiler.program_cuda import kernels_machine_code

    return kernels_machine_code(sources, arch)


def _marked_as(text: str, rules, name: str, memo: dict | None) -> tuple[str, dict[str, int]]:
    """``_marked`` of a kernel's text, remembered in ``memo`` for texts that differ only in the kernel's name."""
    if memo is None or not name or "\0" in text:
        return _marked(text, rules)
    key = (text.replace(name, "\0"), id(rules))
    found = memo.get(key)
    if found is None:
        found = memo[key] = _marked(key[0], rules)
    html, counts = found
    return html.replace("\0", _e(name)), counts


def _marked(text: str, rules) -> tuple[str, dict[str, int]]:
    counts = {kind: 0 for kind, _ in rules}
    lines = []
    for line in text.splitlines():
        kind = classify(line, rules)
        if kind:
            counts[kind] += 1
            lines.append(f'<span class="hot {kind}">{_e(line)}</span>')
        else:
            lines.append(_e(line))
    return '<pre class="code">' + "\n".join(lines) + "</pre>", counts


# ---------------------------------------------------------------------------- roofline chart

@dataclass
class _Axes:
    """A log-log plot area: data ranges (decades) mapped onto an SVG box."""

    x0: float
    x1: float
    y0: float
    y1: float
    width: int = 760
    height: int = 420
    left: int = 70
    bottom: int = 40
    top: int = 14
    right: int = 20
    ticks: list = field(default_factory=list)

    def x(self, value: float) -> float:
        v = min(max(value, self.x0), self.x1)
        return self.left + (math.log10(v) - math.log10(self.x0)) / (math.log10(self.x1) - math.log10(self.x0)) * (
            self.width - self.left - self.right)

    def y(self, value: float) -> float:
        v = min(max(value, self.y0), self.y1)
        span = self.height - self.top - self.bottom
        return self.height - self.bottom - (math.log10(v) - math.log10(self.y0)) / (
            math.log10(self.y1) - math.log10(self.y0)) * span

    def frame(self, xlabel: str, ylabel: str) -> str:
        parts = [f'<rect class="frame" x="{self.left}" y="{self.top}" width="{self.width - self.left - self.right}" '
                 f'height="{self.height - self.top - self.bottom}"/>']
        for d in range(math.floor(math.log10(self.x0)), math.ceil(math.log10(self.x1)) + 1):
            if self.x0 <= 10.0**d <= self.x1:
                x = self.x(10.0**d)
                parts.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{self.top}" '
                             f'y2="{self.height - self.bottom}"/><text class="tick" x="{x:.1f}" '
                             f'y="{self.height - self.bottom + 14}" text-anchor="middle">{_decade(d)}</text>')
        for d in range(math.floor(math.log10(self.y0)), math.ceil(math.log10(self.y1)) + 1):
            if self.y0 <= 10.0**d <= self.y1:
                y = self.y(10.0**d)
                parts.append(f'<line class="grid" x1="{self.left}" x2="{self.width - self.right}" y1="{y:.1f}" '
                             f'y2="{y:.1f}"/><text class="tick" x="{self.left - 4}" y="{y + 4:.1f}" '
                             f'text-anchor="end">{_decade(d)}</text>')
        parts.append(f'<text class="label" x="{(self.left + self.width) / 2:.0f}" y="{self.height - 6}" '
                     f'text-anchor="middle">{_e(xlabel)}</text>')
        parts.append(f'<text class="label" transform="translate(14 {self.height / 2:.0f}) rotate(-90)" '
                     f'text-anchor="middle">{_e(ylabel)}</text>')
        return "".join(parts)


def _decade(d: int) -> str:
    return f"{10.0**d:g}" if -3 <= d <= 4 else f"1e{d}"


def _roofline_section(explained: Explanation) -> str:
    records, roof = explained.kernels, explained.roofline
    text = dict(explained.sections).get("roofline", "")
    note = _e(text.splitlines()[0]) if text else ""
    if not records:
        return _section("roofline", "<p>no steps: the function ran eagerly</p>")
    svg = roofline_svg(records, roof)
    return _section("roofline", f"<p>{note}</p>{LEGEND}{svg}<details><summary>as text</summary>{_pre(text)}</details>")


LEGEND = ('<p class="legend"><span class="key kernel"></span>generated kernel <span class="key library-call"></span>'
          'library call <span class="key copy"></span>copy; faint: not timed (bottom edge) or no FLOPs (left edge); '
          'hover a point for its step</p>')


def roofline_svg(records: list[StepRecord], roof: Roofline | None) -> str:
    """Log-log FLOP/s against FLOPs per byte: the device's memory roof and compute roofs (one per measured
    dtype), one point per step. A step without FLOPs sits at the left edge, an untimed one on the bottom edge."""
    intensities = [r.flops / r.nbytes for r in records if r.flops and r.nbytes]
    rates = [r.placement.achieved_gflops for r in records if r.placement is not None and r.placement.flops]
    peaks = list(roof.peak_gflops.values()) if roof is not None else []
    ridges = [p / roof.copy_gbs for p in peaks] if roof is not None else []
    x_lo, x_hi = _decades(intensities + ridges, 0.01, 100.0)
    y_lo, y_hi = _decades(rates + peaks, 0.01, 100.0)
    axes = _Axes(x_lo / 10, x_hi * 10, y_lo / 10, y_hi * 10)
    parts = [axes.frame("arithmetic intensity (FLOP/byte)", "GFLOP/s")]
    if roof is not None:
        parts += [_roof(axes, roof, dtype, peak) for dtype, peak in roof.peak_gflops.items()]
    for r in records:
        parts.append(_point(axes, r))
    return (f'<svg class="chart roofline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {axes.width} '
            f'{axes.height}" width="{axes.width}" height="{axes.height}">{"".join(parts)}</svg>')


def _roof(axes: _Axes, roof: Roofline, dtype: str, peak: float) -> str:
    """The memory roof up to ``dtype``'s ridge point, then its compute roof."""
    ridge = peak / roof.copy_gbs
    corners = [(axes.x0, axes.x0 * roof.copy_gbs), (ridge, peak), (axes.x1, peak)]
    points = " ".join(f"{axes.x(x):.1f},{axes.y(y):.1f}" for x, y in corners)
    tip = f"{dtype}: peak {peak:.1f} GFLOP/s, copy {roof.copy_gbs:.1f} GB/s, ridge {ridge:.3g} FLOP/B"
    return (f'<polyline class="roof" points="{points}"><title>{_e(tip)}</title></polyline>'
            f'<text class="tick" x="{axes.x(axes.x1) - 4:.1f}" y="{axes.y(peak) - 4:.1f}" '
            f'text-anchor="end">{_e(dtype)} {peak:.1f}</text>')


def _decades(values: list[float], low: float, high: float) -> tuple[float, float]:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    if not values:
        return low, high
    return 10.0 ** math.floor(math.log10(min(values))), 10.0 ** math.ceil(math.log10(max(values)))


def _point(axes: _Axes, r: StepRecord) -> str:
    intensity = r.flops / r.nbytes if r.nbytes else axes.x1
    x = axes.x(intensity if r.flops else axes.x0)
    if r.placement is not None:
        y, cls = axes.y(r.placement.achieved_gflops if r.flops else axes.y0), "pt"
    else:
        y, cls = axes.y(axes.y0), "pt untimed"
    cls += f" {r.kind.replace(' ', '-')}" + ("" if r.flops else " noflops")
    return (f'<circle class="{cls}" cx="{x:.1f}" cy="{y:.1f}" r="5"><title>{_e(r.describe())}</title>'
            "</circle>")


# ---------------------------------------------------------------------------- timeline

LANE = 28


def _timeline_section(explained: Explanation) -> str:
    records = explained.kernels
    if not records:
        return _section("timeline", "<p>no steps</p>")
    timed = any(r.seconds is not None for r in records)
    note = ("each step's median time, the programs' steps one after another" if timed else
            "nothing was timed: each step drawn one unit wide, in program order")
    return _section("timeline", f"<p>{note}</p>{timeline_svg(records)}")


def timeline_svg(records: list[StepRecord], width: int = 1100) -> str:
    """One lane per program, its steps as bars in the order they run, each as wide as its median time."""
    lanes = list(dict.fromkeys(r.program for r in records))
    timed = any(r.seconds is not None for r in records)
    durations = [(r.seconds or 0.0) if timed else 1.0 for r in records]
    total = sum(durations) or 1.0
    left, scale = 130, (width - 140) / total
    parts, clock = [], 0.0
    for r, duration in zip(records, durations):
        y = 6 + lanes.index(r.program) * LANE
        x = left + clock * scale
        parts.append(f'<rect class="bar {r.kind.replace(" ", "-")}" x="{x:.2f}" y="{y}" '
                     f'width="{max(duration * scale, 0.5):.2f}" height="{LANE - 8}"><title>{_e(r.describe())}</title>'
                     "</rect>")
        clock += duration
    for k, lane in enumerate(lanes):
        parts.append(f'<text class="tick" x="4" y="{6 + k * LANE + 15}">{_e(lane or "program")}</text>')
    height = 6 + len(lanes) * LANE + 20
    unit = f"{1e3 * total:.3f} ms" if timed else f"{len(records)} steps"
    parts.append(f'<text class="tick" x="{width - 10}" y="{height - 4}" text-anchor="end">{unit}</text>')
    return (f'<svg class="chart timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
            f'width="{width}" height="{height}">{"".join(parts)}</svg>')


# ---------------------------------------------------------------------------- memory plan

def _memory_section(explained: Explanation, page: _Page) -> str:
    parts = []
    for p in explained.programs:
        plan = _plan_of(p)
        arena = [(value, plan.buffers[index]) for value, index in plan.of.items()
                 if plan.buffers[index].kind == "arena"]
        kinds = {kind: sum(b.kind == kind for b in plan.buffers) for kind in ("input", "output", "arena", "donated")}
        head = (f"{_e(p.label or 'program')}: arena {_bytes(plan.arena_bytes)} (without reuse "
                f"{_bytes(plan.unshared_bytes)}), {kinds['arena']} arena buffer(s), {kinds['input']} input(s), "
                f"{kinds['output']} output(s), {len(plan.copies)} end-of-call copy(ies)")
        parts.append(page.lazy(head, memory_svg(p.fused, arena) + _pre(plan.describe()),
                               f"memory-{_slug(p.label or 'program')}"))
    return _section("memory", "\n".join(parts))


def memory_svg(fused, arena: list, width: int = 1100) -> str:
    """One row per arena buffer (in the order they are first written): a bar over the steps it is live."""
    spans = lifetimes(fused)
    steps = max(len(steps_of(fused)), 1)
    rows = sorted(((spans.get(value, (0, steps)), value, buffer) for value, buffer in arena),
                  key=lambda row: (row[0], row[2].slot))
    row_height = 14 if len(rows) <= 120 else 6
    left, scale = 60, (width - 70) / (steps + 1)
    parts = []
    for k, ((start, end), value, buffer) in enumerate(rows):
        y = 20 + k * row_height
        tip = (f"{value.type.dtype.name}{list(value.type.shape)}: {value.type.nbytes} bytes at arena offset "
               f"{buffer.slot}, live from step {start} to step {end}")
        parts.append(f'<rect class="life" x="{left + start * scale:.2f}" y="{y}" '
                     f'width="{max((end - start + 1) * scale, 1):.2f}" height="{row_height - 2}"><title>{_e(tip)}'
                     "</title></rect>")
    for step in range(0, steps + 1, max(1, steps // 20)):
        parts.append(f'<text class="tick" x="{left + (step + 0.5) * scale:.1f}" y="12" '
                     f'text-anchor="middle">{step}</text>')
    parts.append('<text class="tick" x="4" y="12">step</text>')
    height = 24 + len(rows) * row_height
    return (f'<svg class="chart memory" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
            f'width="{width}" height="{height}">{"".join(parts)}</svg>')


# ---------------------------------------------------------------------------- style and script

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 2em 4em;color:#1d2430}
header{position:sticky;top:0;background:#fff;border-bottom:1px solid #d6dbe3;padding:.4em 0;z-index:1}
h1{font-size:1.15em;margin:.3em 0}nav a{margin-right:1em}h2{margin-top:1.6em;border-bottom:1px solid #e3e6eb}
pre{font:12px/1.35 ui-monospace,Menlo,Consolas,monospace;background:#f6f8fa;padding:.6em;overflow:auto;
max-height:40em;margin:.3em 0}
details{margin:.25em 0}summary{cursor:pointer}details>.body{margin-left:1.2em}
.tag{font-size:.8em;padding:0 .4em;border-radius:3px;background:#e8ebf0;margin-left:.3em}
.tag.changed{background:#fff1c2}.tag.mma,.hot.mma{background:#d5f5dd}.tag.vector,.hot.vector{background:#dbe8ff}
.tag.spill,.hot.spill{background:#ffd9d6}.meta{color:#5b6575;font-size:.9em}
del{background:#ffe3e0;text-decoration:line-through;display:block}ins{background:#dcf7e1;text-decoration:none;
display:block}
.side{display:grid;grid-template-columns:1fr 1fr;gap:.6em}.side pre{max-height:50em}
table.summary{border-collapse:collapse}table.summary td,table.summary th{border:1px solid #d6dbe3;padding:.15em .6em;
text-align:right}
.chart{display:block;max-width:100%;height:auto}.frame{fill:none;stroke:#8a93a3}.grid{stroke:#eceff3}
.tick{font-size:11px;fill:#4b5563}.label{font-size:12px;fill:#1d2430}
.roof{fill:none;stroke:#c0392b;stroke-width:2}
.pt{fill:#2563eb;fill-opacity:.75;stroke:#1e3a8a}.pt.library-call{fill:#f59e0b;stroke:#92400e}
.pt.copy{fill:#6b7280}.pt.untimed,.pt.noflops{fill-opacity:.15}
.bar{fill:#2563eb;stroke:#fff;stroke-width:.3}.bar.library-call{fill:#f59e0b}.bar.copy{fill:#6b7280}
.life{fill:#0d9488}.same{margin:.25em 0 .25em 1em}
.key{display:inline-block;width:.8em;height:.8em;border-radius:50%;background:#2563eb;margin:0 .3em 0 .8em}
.key.library-call{background:#f59e0b}.key.copy{background:#6b7280}
"""

SCRIPT = """
(function () {
  function fill(d) {
    var body = d.querySelector(".body");
    if (!d.open || !body || body.dataset.filled) return;
    body.innerHTML = JSON.parse(document.getElementById(d.dataset.lazy).textContent);
    body.dataset.filled = "1";
  }
  document.addEventListener("toggle", function (e) {
    if (e.target.dataset && e.target.dataset.lazy) fill(e.target);
  }, true);
  function openFragment() {
    var d = location.hash ? document.getElementById(decodeURIComponent(location.hash.slice(1))) : null;
    if (d && d.dataset.lazy) { d.open = true; fill(d); d.scrollIntoView(); }
  }
  window.addEventListener("hashchange", openFragment);
  openFragment();
})();
"""
