"""A few lines instead of the full diff: what ``k3deploy plan INVENTORY --json`` would change, per node (counts of
changed files, command-line flags, environment and unit lines; the image), and what restarts in which order.

    k3deploy plan INVENTORY --json | python tools/plan_summary.py

``tools/demo.sh`` prints it; ``k3deploy plan INVENTORY`` (or ``pyinfra INVENTORY deploy/k3.py --dry --diff``) shows
every line.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

_WHAT = {"argv": "flag line", "env": "env line", "unit": "unit line"}


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def summary(plan: dict[str, Any]) -> list[str]:
    """The summary's lines for a plan as ``k3deploy plan --json`` prints it."""
    if not plan.get("changes_pending"):
        return ["no changes: every node runs what the inventory asks for"]
    out = []
    for h in plan.get("hosts", []):
        changes = h.get("changes", [])
        if not changes:
            out.append(f"{h['host']} ({h.get('role')} rank {h.get('rank')}): no changes")
            continue
        files = Counter(c.get("op", "change") for c in changes if c["kind"] == "file")
        lines = Counter(c["kind"] for c in changes if c["kind"] in _WHAT)
        parts = [f"{n} file{'s' if n != 1 else ''} to {op}" for op, n in sorted(files.items())]
        parts += [_count(n, _WHAT[k]) + " changed" for k, n in sorted(lines.items())]
        if any(c["kind"] == "image" for c in changes):
            parts.append("a new image")
        out.append(f"{h['host']} ({h.get('role')} rank {h.get('rank')}): " + ", ".join(parts))
    order = plan.get("restart_order") or []
    out.append("restarts, in order: " + (", ".join(order) if order else "nothing"))
    if plan.get("endpoint"):
        out.append(f"endpoint afterwards: {plan['endpoint']}")
    return out


def main() -> int:
    for line in summary(json.load(sys.stdin)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
