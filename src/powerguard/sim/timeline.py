"""The outage as a picture: a Gantt chart of one trace's spans (PNG through Pillow, and a
self-contained HTML page with the same chart as inline SVG and a hover title per span)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from .otlp import Span

COLORS = {
    "ups-monitor": "#e4572e",
    "coordinator": "#4c6ef5",
    "power-control": "#2f9e44",
    "ckpt-agent": "#f59f00",
}
ROW, LABEL_W, CHART_W, PAD = 22, 420, 900, 16


def _color(service: str) -> str:
    return next((c for k, c in COLORS.items() if k in service), "#868e96")


def _rows(spans: Sequence[Span]) -> tuple[list[tuple[Span, float, float]], float]:
    """(span, x0, x1) in chart pixels, and the trace's length in seconds."""
    t0 = min(s.start_ns for s in spans)
    t1 = max(s.end_ns for s in spans)
    total = max((t1 - t0) / 1e9, 1e-3)
    scale = CHART_W / total
    return [(s, (s.start_ns - t0) / 1e9 * scale, (s.end_ns - t0) / 1e9 * scale) for s in spans], total


def _label(s: Span) -> str:
    rank = s.attributes.get("powerguard.rank")
    extra = f" [rank {rank}]" if rank is not None else ""
    return f"{s.service.removeprefix('powerguard-')}: {s.name}{extra}"


def write_png(spans: Sequence[Span], path: Path, title: str) -> None:
    from PIL import Image, ImageDraw, ImageFont

    rows, total = _rows(spans)
    height = PAD * 4 + ROW * (len(rows) + 2)
    img = Image.new("RGB", (LABEL_W + CHART_W + PAD * 3 + 90, height), "white")
    d = ImageDraw.Draw(img)
    try:
        font = ImageFont.load_default(size=13)
    except TypeError:  # Pillow < 10.1
        font = ImageFont.load_default()
    d.text((PAD, PAD), title, fill="black", font=font)
    top = PAD * 3
    x0 = LABEL_W + PAD * 2
    for i in range(11):  # time grid
        x = x0 + CHART_W * i / 10
        d.line([(x, top - 4), (x, top + ROW * len(rows))], fill="#e9ecef")
        d.text((x - 10, top + ROW * len(rows) + 4), f"{total * i / 10:.1f}s", fill="#495057", font=font)
    for i, (s, a, b) in enumerate(rows):
        y = top + i * ROW
        d.text((PAD, y + 3), _label(s)[:60], fill="#212529", font=font)
        d.rectangle(
            [x0 + a, y + 3, x0 + max(b, a + 2), y + ROW - 3],
            fill=_color(s.service),
            outline="#c92a2a" if s.error else None,
            width=2 if s.error else 0,
        )
        if s.duration_s >= 0.001:
            d.text(
                (x0 + max(b, a + 2) + 4, y + 3),
                f"{s.duration_s * 1000:.0f} ms" if s.duration_s < 1 else f"{s.duration_s:.1f} s",
                fill="#495057",
                font=font,
            )
    img.save(path)


def write_html(spans: Sequence[Span], path: Path, title: str) -> None:
    rows, total = _rows(spans)
    width, height = LABEL_W + CHART_W + PAD * 3 + 80, PAD * 3 + ROW * (len(rows) + 2)
    x0 = LABEL_W + PAD * 2
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">'
    ]
    for i in range(11):
        x = x0 + CHART_W * i / 10
        parts.append(
            f'<line x1="{x}" y1="{PAD}" x2="{x}" y2="{PAD + ROW * len(rows)}" stroke="#e9ecef"/>'
            f'<text x="{x - 10}" y="{PAD + ROW * len(rows) + 16}" fill="#495057">{total * i / 10:.1f}s</text>'
        )
    for i, (s, a, b) in enumerate(rows):
        y = PAD + i * ROW
        tip = html.escape(
            f"{s.name} ({s.service}) {s.duration_s * 1000:.1f} ms "
            + " ".join(f"{k}={v}" for k, v in s.attributes.items() if k.startswith(("powerguard.", "messaging.")))
        )
        stroke = ' stroke="#c92a2a" stroke-width="2"' if s.error else ""
        parts.append(
            f'<text x="{PAD}" y="{y + 15}">{html.escape(_label(s)[:70])}</text>'
            f'<rect x="{x0 + a:.1f}" y="{y + 3}" width="{max(b - a, 2):.1f}" height="{ROW - 6}" '
            f'fill="{_color(s.service)}"{stroke}>'
            f"<title>{tip}</title></rect>"
        )
    parts.append("</svg>")
    legend = " ".join(f'<span style="color:{c}">&#9632; {k}</span>' for k, c in COLORS.items())
    path.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
        f"<body style='font-family:sans-serif'><h3>{html.escape(title)}</h3><p>{legend}</p>{''.join(parts)}"
        "</body></html>"
    )
