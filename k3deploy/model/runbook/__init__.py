"""A bring-up runbook for people who type the commands, from the same rollout ``deploy/k3.py`` executes:
:mod:`sections` (one function per section), :mod:`checks` (the command behind each preflight check),
:mod:`document` (the document model, Markdown and HTML, and reading the command blocks back).

Example::

    >>> doc = build(rollout, Context(inventory="inventories/gb300.py", ...))   # doctest: +SKIP
    >>> open("bringup.md", "w").write(to_markdown(doc))                        # doctest: +SKIP
"""

from __future__ import annotations

from k3deploy.model.runbook.document import Block, Doc, blocks, to_html, to_markdown
from k3deploy.model.runbook.sections import CONTROL, Context, build

__all__ = ["CONTROL", "Block", "Context", "Doc", "blocks", "build", "to_html", "to_markdown"]
