"""Live device memory over time, one band per allocation: a memory snapshot's history drawn as one file.

[Note: memory timeline] This is the picture torch's memory_viz calls the active memory timeline, drawn without a
browser-side script: the x axis counts the trace's alloc and free actions (so a burst of small frees is as wide
as a slow one), the y axis is live bytes. Live allocations are stacked in the order they were made; when one is
freed, those above it drop by its size, so every band is a step polygon and the top of the stack is the total.
The ``LABELLED`` largest allocations get a colour of their own and a legend entry naming their size and the
innermost Python frames that made them outside tilewise; every band carries its size and frames as a tooltip. An
allocation freed in the trace but made before it began starts at the left edge; one still live at the end runs
to the right edge. A long trace is sampled once per pixel column (the totals stay exact; an allocation living
between two samples shows only in the total's area beneath the bands), and a band thinner than half a pixel is
left to that area too, so a step of tens of thousands of actions draws in a second or two. HTML is
self-contained (inline SVG); a ``.png`` path draws the same with matplotlib, where it is installed.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
LABELLED = 10
WIDTH, HEIGHT, MARGIN = 1000, 420, 60
COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac")
UNLABELLED = "#c9d3df"


@dataclass(eq=False)
class Band:
    """One allocation's place in the stack: (action index, offset in bytes) at every change."""

    addr: int
    size: int
    frames: list
    start: int
    end: int = -1
    steps: list = field(default_factory=list)

    def outline(self) -> list[tuple[float, float]]:
        """The band's polygon in (index, bytes): along its bottom edge, then back along its top."""
        bottom = []
        for k, (t, offset) in enumerate(self.steps):
            if k:
                bottom.append((t, self.steps[k - 1][1]))
            bottom.append((t, offset))
        bottom.append((self.end, self.steps[-1][1]))
        return bottom + [(t, offset + self.size) for t, offset in reversed(bottom)]


def stack_bands(trace: list[dict], columns: int | None = None) -> tuple[list[Band], list[int], int]:
    """The bands of a device trace, the total live bytes after each action, and the number of actions + 1.
    Bands' offsets are sampled after every action, or, with ``columns`` fewer than the actions, ``columns`` times
    evenly (what a plot that wide can show; a band living between two samples then has no steps)."""
    events = [e for e in trace if e["action"] in ("alloc", "free_requested")]
    live: list[Band] = _made_before_trace(events)
    bands: list[Band] = list(live)
    totals: list[int] = []
    every = 1.0 if columns is None or len(events) <= columns else len(events) / columns
    _sample(live, 0)
    total, next_sample = sum(b.size for b in live), every
    for t, event in enumerate(events, start=1):
        if event["action"] == "alloc":
            band = Band(event["addr"], event["size"], event.get("frames", []), t)
            live.append(band)
            bands.append(band)
            total += band.size
        else:
            total -= _free(live, event["addr"], t)
        totals.append(total)
        if t >= next_sample:
            _sample(live, t)
            next_sample += every
    end = len(events) + 1
    for band in live:
        band.end = end
    return bands, totals, end


def _sample(live: list[Band], t: int) -> None:
    """Note each live band's offset at ``t`` where it changed (the bands below it were freed) or is new."""
    offset = 0
    for band in live:
        if not band.steps or band.steps[-1][1] != offset:
            band.steps.append((t, offset))
        offset += band.size


def _made_before_trace(events: list[dict]) -> list[Band]:
    """Allocations the trace frees but never made (recording began while they were live), in free order."""
    seen, found = set(), []
    for event in events:
        if event["action"] == "alloc":
            seen.add(event["addr"])
        elif event["addr"] not in seen:
            found.append(Band(event["addr"], event["size"], event.get("frames", []), 0))
        else:
            seen.discard(event["addr"])
    return found


def _free(live: list[Band], addr: int, t: int) -> int:
    """Close the live band at ``addr`` (the latest made there); its size, or 0 if none was live there."""
    for k in range(len(live) - 1, -1, -1):
        band = live[k]
        if band.addr == addr:
            del live[k]
            band.end = t
            return band.size
    return 0


def describe(frames: list, depth: int = 3) -> str:
    """The innermost frames of the code that asked for the memory (tilewise's own frames skipped where others
    remain: the line of the model or script is what names an allocation)."""
    outside = [f for f in frames if not f["filename"].startswith(PACKAGE_DIR)] or frames
    return " ← ".join(f"{f['name']} ({f['filename']}:{f['line']})" for f in outside[:depth]) or "(no frames recorded)"


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def device_trace(snapshot: dict, device: int | None) -> tuple[int, list[dict]]:
    traces = snapshot["device_traces"]
    if device is None:
        device = next((d for d, trace in enumerate(traces) if trace), 0)
    if device >= len(traces) or not traces[device]:
        raise ValueError(f"plot_timeline: the snapshot has no recorded actions for cuda:{device} (record them "
                         f"with tilewise.cuda.memory._record_memory_history(enabled='all') before taking it)")
    return device, traces[device]


def plot_timeline(snapshot: dict, path: str, device: int | None = None) -> None:
    """Draw ``snapshot``'s history of ``device`` (default: the first with one) to ``path``: self-contained HTML,
    or PNG through matplotlib when ``path`` ends in ``.png``."""
    device, trace = device_trace(snapshot, device)
    bands, totals, end = stack_bands(trace, columns=WIDTH - 2 * MARGIN)
    labelled = sorted(bands, key=lambda b: -b.size)[:LABELLED]
    if str(path).endswith(".png"):
        _write_png(path, bands, labelled, end, device)
        return
    with open(path, "w", encoding="utf-8") as file:
        file.write(render_html(bands, labelled, totals, end, device))


class Canvas:
    """Bytes and action indices to the SVG's pixels, and polygons cut down to what a pixel can show."""

    def __init__(self, end: int, peak: int):
        self.x_scale = (WIDTH - 2 * MARGIN) / end
        self.y_scale = (HEIGHT - 2 * MARGIN) / peak

    def pixel(self, t: float, y: float) -> tuple[float, float]:
        return round(MARGIN + t * self.x_scale, 1), round(HEIGHT - MARGIN - y * self.y_scale, 1)

    def path(self, points) -> str:
        """The points in pixels, each run within one pixel column kept only by its first and last point (a band
        of a long trace changes level many times per column; the eye sees only the extremes)."""
        kept: list[tuple[float, float]] = []
        for x, y in (self.pixel(t, v) for t, v in points):
            if kept and kept[-1] == (x, y):
                continue
            if len(kept) >= 2 and int(kept[-1][0]) == int(x) == int(kept[-2][0]):
                kept[-1] = (x, y)
            else:
                kept.append((x, y))
        return " ".join(f"{x},{y}" for x, y in kept)


def render_html(bands: list[Band], labelled: list[Band], totals: list[int], end: int, device: int) -> str:
    """The page: the total as a filled area, then a polygon per allocation at least half a pixel tall (smaller
    ones show as the area beneath), the labelled ones coloured."""
    peak = max(totals + [sum(b.size for b in bands if b.start == 0)], default=0) or 1
    colour = {id(b): COLOURS[k % len(COLOURS)] for k, b in enumerate(labelled)}
    canvas = Canvas(end, peak)
    visible = 0.5 / canvas.y_scale
    polygons = []
    for band in bands:
        if not band.steps or (band.size < visible and id(band) not in colour):
            continue
        tip = html.escape(f"{format_bytes(band.size)} at {band.addr:#x}\n{describe(band.frames, 8)}")
        polygons.append(f'<polygon class="allocation" data-addr="{band.addr}" data-size="{band.size}" '
                        f'points="{canvas.path(band.outline())}" fill="{colour.get(id(band), UNLABELLED)}" '
                        f'stroke="white" stroke-width="0.3"><title>{tip}</title></polygon>')
    steps = [(0, totals[0] if totals else 0)] + list(enumerate(totals, start=1)) + [(end, totals[-1] if totals else 0)]
    total_line = canvas.path(steps)
    area = canvas.path([(0, 0)] + steps + [(end, 0)])
    legend = "".join(f'<li><span style="background:{colour[id(b)]}"></span>{format_bytes(b.size)} — '
                     f'{html.escape(describe(b.frames))}</li>' for b in labelled)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>cuda:{device} memory timeline</title>
<style>body{{font-family:sans-serif;margin:20px}} li span{{display:inline-block;width:12px;height:12px;
margin-right:6px}} ul{{list-style:none;padding:0;font-size:13px}}</style></head><body>
<h2>cuda:{device}: live memory over {end - 1} allocator actions (peak <span id="peak">{format_bytes(peak)}</span>,
{len(bands)} allocations)</h2>
<svg width="{WIDTH}" height="{HEIGHT}" xmlns="http://www.w3.org/2000/svg">
<line x1="{MARGIN}" y1="{HEIGHT - MARGIN}" x2="{WIDTH - MARGIN}" y2="{HEIGHT - MARGIN}" stroke="black"/>
<line x1="{MARGIN}" y1="{MARGIN}" x2="{MARGIN}" y2="{HEIGHT - MARGIN}" stroke="black"/>
<text x="{MARGIN - 4}" y="{MARGIN}" text-anchor="end" font-size="11">{format_bytes(peak)}</text>
<text x="{MARGIN - 4}" y="{HEIGHT - MARGIN}" text-anchor="end" font-size="11">0</text>
<text x="{WIDTH / 2}" y="{HEIGHT - MARGIN / 3}" text-anchor="middle" font-size="12">allocator action</text>
<polygon id="total-area" points="{area}" fill="{UNLABELLED}"/>
{chr(10).join(polygons)}
<polyline id="total" points="{total_line}" fill="none" stroke="black" stroke-width="1"/>
</svg>
<h3>Largest allocations</h3><ul id="legend">{legend}</ul>
</body></html>
"""


def _write_png(path: str, bands: list[Band], labelled: list[Band], end: int, device: int) -> None:
    try:
        from matplotlib import pyplot
    except ImportError as exc:
        raise RuntimeError("plot_timeline: a .png needs matplotlib, which is not installed; write .html "
                           "instead") from exc
    figure, axes = pyplot.subplots(figsize=(12, 5))
    colour = {id(b): COLOURS[k % len(COLOURS)] for k, b in enumerate(labelled)}
    for band in (b for b in bands if b.steps):
        xs, ys = zip(*band.outline(), strict=True)
        label = f"{format_bytes(band.size)}: {describe(band.frames, 1)}" if id(band) in colour else None
        axes.fill(xs, ys, color=colour.get(id(band), UNLABELLED), linewidth=0.2, edgecolor="white", label=label)
    axes.set_xlim(0, end)
    axes.set_xlabel("allocator action")
    axes.set_ylabel("live bytes")
    axes.set_title(f"cuda:{device} memory timeline")
    axes.legend(fontsize=7, loc="upper left")
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
