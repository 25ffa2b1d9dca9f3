"""The champion's lineage as a hand-written SVG: seed at the top, champion at the bottom."""

from __future__ import annotations

from html import escape
from typing import Any

from archive import edit_label

from ._values import clean

WIDTH, BOX_W, BOX_H, GAP = 720, 300, 46, 64


def _value(row: dict[str, Any], key: str) -> Any:
    return clean(row.get(key))


def _speedup_text(speedup: float | None) -> str:
    return f"{speedup:.3f}x" if speedup is not None else "n/a"


def lineage_svg(chain: list[dict[str, Any]], title: str = "lineage") -> str:
    """Draw ``chain`` (archive rows ordered seed -> champion) as SVG text.

    Each box shows the generation, individual id, status and speedup; each edge is labelled with
    the edit that made the child and the speedup it brought (child / parent).
    """
    height = 40 + len(chain) * (BOX_H + GAP)
    x0 = (WIDTH - BOX_W) // 2
    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" font-family="monospace" font-size="12">'),
           ('<defs><marker id="arrow" markerWidth="10" markerHeight="8" refX="9" refY="4" '
            'orient="auto"><path d="M0,0 L10,4 L0,8 z" fill="#555"/></marker></defs>'),
           f'<text x="10" y="20" font-size="14" font-weight="bold">{escape(title)}</text>']
    previous: float | None = None
    for i, row in enumerate(chain):
        y = 34 + i * (BOX_H + GAP)
        speedup = _value(row, "speedup_vs_reference")
        status = _value(row, "status") or "?"
        fill = "#e3f4e3" if status == "PASS" else "#f8e1e1"
        if i:
            y_from = y - GAP
            out.append(f'<line x1="{WIDTH // 2}" y1="{y_from}" x2="{WIDTH // 2}" y2="{y - 2}" '
                       'stroke="#555" stroke-width="1.5" marker-end="url(#arrow)"/>')
            gain = (f"x{speedup / previous:.3f}" if speedup is not None and previous else "x?")
            label = f"{edit_label(row)[:70]}  {gain}"
            out.append(f'<text x="{WIDTH // 2 + 8}" y="{y_from + GAP // 2 + 4}">{escape(label)}</text>')
        ind = str(_value(row, "individual_id") or "?")
        gen = _value(row, "generation")
        line1 = f"g{gen if gen is not None else '?'}  {ind}"
        line2 = f"{status}  speedup {_speedup_text(speedup)}"
        out.append(f'<rect x="{x0}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="6" fill="{fill}" '
                   'stroke="#333"/>')
        out.append(f'<text x="{x0 + 10}" y="{y + 19}">{escape(line1)}</text>')
        out.append(f'<text x="{x0 + 10}" y="{y + 36}">{escape(line2)}</text>')
        previous = speedup
    out.append("</svg>")
    return "\n".join(out) + "\n"
