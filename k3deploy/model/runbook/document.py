"""The runbook as a document: headings, paragraphs, tables and command blocks that name their node, rendered
as Markdown or HTML, and read back (:func:`blocks`) so a runbook can be executed and tested mechanically.

* Markdown: a fenced block whose info string is ``sh node=NAME`` (``node=control`` is the machine that holds the
  inventory); ``when=rollback``, ``when=rolling`` or ``when=troubleshooting`` marks blocks that are not part of the
  bring-up.
* HTML: ``<pre><code class="language-sh" data-node="NAME" data-when="...">``.

    >>> d = Draft(); d.block("n1", "echo hi")
    >>> blocks(to_markdown(d.done()))
    [Block(node='n1', text='echo hi\\n', when=None)]
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Block:
    node: str
    text: str
    when: str | None = None


@dataclass(frozen=True)
class Doc:
    """The runbook as a flat sequence of items: ("h", level, text), ("p", text), ("block", Block), ("code", text),
    ("table", header, rows); written whole by a :class:`Draft`."""

    items: tuple[tuple[Any, ...], ...] = ()


@dataclass
class Draft:
    """A runbook being written, section by section (:func:`k3deploy.model.runbook.sections.build`): each call adds
    one item; :meth:`done` gives the :class:`Doc`."""

    items: list[tuple[Any, ...]] = field(default_factory=list)

    def done(self) -> Doc:
        return Doc(tuple(self.items))

    def h(self, level: int, text: str) -> None:
        self.items.append(("h", level, text))

    def p(self, text: str) -> None:
        self.items.append(("p", text))

    def block(self, node: str, text: str, when: str | None = None) -> None:
        self.items.append(("block", Block(node, text.rstrip("\n"), when)))

    def code(self, text: str) -> None:
        """Text shown for reading, not a command block."""
        self.items.append(("code", text))

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self.items.append(("table", header, rows))


# ---------------------------------------------------------------------------------- render


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(doc: Doc) -> str:
    out: list[str] = []
    for item in doc.items:
        kind = item[0]
        if kind == "h":
            out.append("#" * item[1] + " " + item[2])
        elif kind == "p":
            out.append(item[1])
        elif kind == "block":
            b: Block = item[1]
            info = f"sh node={b.node}" + (f" when={b.when}" if b.when else "")
            out.append(f"```{info}\n{b.text}\n```")
        elif kind == "code":
            out.append(f"```text\n{item[1]}\n```")
        elif kind == "table":
            header, rows = item[1], item[2]
            lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
            out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


def _inline(text: str) -> str:
    s = html.escape(text)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", s)


def to_html(doc: Doc) -> str:
    title = next((i[2] for i in doc.items if i[0] == "h"), "Runbook")
    out = ["<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\">", f"<title>{html.escape(title)}</title>",
           "<style>body{font-family:sans-serif;max-width:70em;margin:auto}pre{background:#f4f4f4;padding:.6em;"
           "overflow-x:auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .4em;"
           "vertical-align:top}.node{font-size:.8em;color:#555}</style>", "</head><body>"]
    for item in doc.items:
        kind = item[0]
        if kind == "h":
            out.append(f"<h{item[1]}>{html.escape(item[2])}</h{item[1]}>")
        elif kind == "p":
            out.append(f"<p>{_inline(item[1])}</p>")
        elif kind == "block":
            b = item[1]
            when = f' data-when="{html.escape(b.when)}"' if b.when else ""
            label = f"on {b.node}" + (f" ({b.when})" if b.when else "")
            out.append(f"<div class=\"node\">{html.escape(label)}</div><pre><code class=\"language-sh\" "
                       f"data-node=\"{html.escape(b.node)}\"{when}>{html.escape(b.text)}</code></pre>")
        elif kind == "code":
            out.append(f"<pre><code>{html.escape(item[1])}</code></pre>")
        elif kind == "table":
            rows = "".join("<tr>" + "".join(f"<td>{_inline(str(c))}</td>" for c in row) + "</tr>" for row in item[2])
            head = "".join(f"<th>{html.escape(h)}</th>" for h in item[1])
            out.append(f"<table><tr>{head}</tr>{rows}</table>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


BLOCK = re.compile(r"^```sh node=(?P<node>\S+)(?: when=(?P<when>\S+))?\n(?P<text>.*?)^```$", re.M | re.S)


def blocks(markdown: str) -> list[Block]:
    """The command blocks of a Markdown runbook, in document order."""
    return [Block(m["node"], m["text"], m["when"]) for m in BLOCK.finditer(markdown)]
