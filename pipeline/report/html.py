"""Reports a person reads: one Markdown file, one self-contained HTML file (plots embedded as data
URIs, no network) and the PNG plots beside them, from a list of sections. The corpus report
(``pipeline.report.corpus_report``) and the XNLI report (``xeval.report``) are written with it; paths may be local
or in a bucket (``pipeline.output.fs``)."""
from __future__ import annotations

import base64
import dataclasses
import html
import io
import re
import threading
from typing import Any, Iterable, Sequence

from ..output import fs

STYLE = ("body{font-family:sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse;margin:.5em 0}"
         "td,th{border:1px solid #bbb;padding:2px 6px;text-align:left}td.n{text-align:right}"
         "img{max-width:100%}.warn{background:#fee;border:1px solid #c00;padding:.5em}"
         "figcaption{color:#555;font-size:small}")

NUMBER = re.compile(r"[-+]?[\d,.]+( ± [\d,.]+)?%?|–")  # cells right-aligned in HTML tables


@dataclasses.dataclass
class Table:
    header: list[str]
    rows: list[list[str]]
    caption: str = ""


@dataclasses.dataclass
class Section:
    """A heading, then warnings (shown boxed), paragraphs, plots (``(file name, PNG bytes)``) and tables."""

    heading: str
    paragraphs: list[str] = dataclasses.field(default_factory=list)
    tables: list[Table] = dataclasses.field(default_factory=list)
    plots: list[tuple[str, bytes]] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)


def markdown_table(table: Table) -> list[str]:
    cells = [[c.replace("|", "\\|") for c in row] for row in table.rows]
    lines = ["| " + " | ".join(table.header) + " |", "|" + "---|" * len(table.header)]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return ([f"*{table.caption}*", ""] if table.caption else []) + lines


def html_table(table: Table) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in table.header)
    body = "".join("<tr>" + "".join(f'<td class="n">{html.escape(c)}</td>' if NUMBER.fullmatch(c) else
                                    f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in table.rows)
    caption = f"<caption>{html.escape(table.caption)}</caption>" if table.caption else ""
    return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def png(fig: Any) -> bytes:
    """A matplotlib figure as PNG bytes (no timestamp or software tag: the same figure, the same bytes)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


_PYPLOT = threading.Lock()


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display needed); one thread at a time, so that
    no thread selects the backend while another is still importing pyplot."""
    with _PYPLOT:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    return plt


def render_report(title: str, sections: list[Section], intro: Sequence[str] = ()) -> list[tuple[str, bytes]]:
    """``(file name, bytes)`` of every plot's PNG, then ``report.md`` and ``report.html``."""
    md = [f"# {title}", "", *intro, ""]
    page = ["<!DOCTYPE html>", f'<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>',
            f"<style>{STYLE}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
            *[f"<p>{html.escape(line)}</p>" for line in intro]]
    files = []
    for section in sections:
        md += [f"## {section.heading}", ""]
        page.append(f"<h2>{html.escape(section.heading)}</h2>")
        for warning in section.warnings:
            md += [f"> **{warning}**", ""]
            page.append(f'<p class="warn"><strong>{html.escape(warning)}</strong></p>')
        for paragraph in section.paragraphs:
            md += [paragraph, ""]
            page.append(f"<p>{html.escape(paragraph)}</p>")
        for name, data in section.plots:
            files.append((name, data))
            md += [f"![{section.heading}]({name})", ""]
            page.append(f'<figure><img alt="{html.escape(section.heading)}" '
                        f'src="data:image/png;base64,{base64.b64encode(data).decode()}">'
                        f"<figcaption>{html.escape(name)}</figcaption></figure>")
        for table in section.tables:
            md += [*markdown_table(table), ""]
            page.append(html_table(table))
    page.append("</body></html>")
    return [*files, ("report.md", "\n".join(md).encode("utf-8")),
            ("report.html", ("\n".join(page) + "\n").encode("utf-8"))]


def write_files(out: str, files: Iterable[tuple[str, bytes]]) -> list[str]:
    """Each ``(file name, bytes)`` written into folder ``out``, whole or not at all; returns the paths."""
    written = []
    for name, data in files:
        path = fs.join(out, name)
        fs.write_atomic(path, lambda stream, data=data: stream.write(data))
        written.append(path)
    return written


def write_report(out: str, title: str, sections: list[Section], intro: Sequence[str] = ()) -> list[str]:
    """Write ``report.md``, ``report.html`` and every plot's PNG into folder ``out``; returns the paths."""
    return write_files(out, render_report(title, sections, intro))
