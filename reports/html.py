"""Small HTML building blocks shared by the run and sweep reports (no template engine)."""

from __future__ import annotations

import html
import math

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1150px;
color:#222;padding:0 1em;line-height:1.4}
h1{font-size:1.5em;margin-bottom:.2em}
h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
h3{font-size:1em;margin:1.2em 0 .3em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ddd;padding:.25em .55em;text-align:right;vertical-align:top}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
td.text,th.text{text-align:left}
figure{margin:.8em 0}figure img{max-width:100%;display:block}
figcaption{color:#555;font-size:.85em}
.meta{color:#444;font-size:.9em}.meta b{color:#111}
.note{background:#fff8e1;border-left:3px solid #ffb300;padding:.4em .8em}
.absent{color:#666;font-style:italic}
.holds{color:#1b5e20;font-weight:600}.fails{color:#b71c1c;font-weight:600}
.unmeasured{color:#666}
nav a{margin-right:1em}.scroll{overflow-x:auto;max-width:100%}
#sweep-table{font-size:.62em}#sweep-table td,#sweep-table th{padding:.2em .15em}
#sweep-table th{min-width:3.2em;max-width:5.6em;white-space:normal;overflow-wrap:normal}
"""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def fmt(value: object, digits: int = 2) -> str:
    """A table cell's text: thousands separators, fixed digits, '–' for missing."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "–"
        if value != 0 and abs(value) < 1:
            return f"{value:.3g}" if abs(value) >= 1e-4 else f"{value:.2e}"
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return esc(value)


class Raw(str):
    """Cell content that is already HTML (not escaped by ``table``)."""


def table(header: list[str], rows: list[list], *, text_columns: tuple[int, ...] = (0,),
          digits: int = 2, css_id: str | None = None) -> str:
    """An HTML table; ``Raw`` cells pass through, the rest go through ``fmt``."""
    def cell(i: int, value: object, tag: str) -> str:
        cls = " class='text'" if i in text_columns else ""
        body = value if isinstance(value, Raw) else fmt(value, digits)
        return f"<{tag}{cls}>{body}</{tag}>"

    head = "".join(cell(i, Raw(esc(h)), "th") for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(cell(i, c, "td") for i, c in enumerate(row)) + "</tr>"
                   for row in rows)
    attr = f" id='{esc(css_id)}'" if css_id else ""
    return (f"<div class='scroll'><table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
            "</table></div>")


def figure(data_uri: str, alt: str, caption: str | None = None) -> str:
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return f"<figure><img alt='{esc(alt)}' src='{data_uri}'>{cap}</figure>"


def absent(what: str) -> str:
    return f"<p class='absent'>{esc(what)}: not measured in this run.</p>"


def page(title: str, body_parts: list[str]) -> str:
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(body_parts) + "\n</body></html>\n")
