"""The README read as its tests read it: its first hour (the copy-paste block under ``## The first hour``) as
commands, the bash script that runs them one by one recording each exit code, and every relative link of the
README and ``docs/``."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from helpers import BIN, ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: the first hour's heading and what its first-hour block may exit with besides 0 (``plan``: 3 = changes pending)
FIRST_HOUR = "## The first hour"
ALLOWED_EXIT = {"k3deploy plan": {0, 3}}
#: the marker the script prints after each command: ``@@ <index> <exit code>``
MARK = "@@"


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def first_hour(text: str | None = None) -> list[str]:
    """The commands of the README's first hour, in order (its first ``sh`` block under the heading), each a line
    as a person pastes it (the trailing comment removed)."""
    text = README.read_text() if text is None else text
    section = text.split(FIRST_HOUR, 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    out = []
    for line in block.splitlines():
        code = strip_comment(line).strip()
        if code:
            out.append(code)
    return out


def strip_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` inside quotes or ``$(...)`` is kept)."""
    quote = ""
    depth = 0
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "#" and depth == 0 and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def allowed(command: str) -> set[int]:
    for prefix, codes in ALLOWED_EXIT.items():
        if command.startswith(prefix):
            return codes
    return {0}


def script(commands: list[str], name: str) -> str:
    """A bash script of ``commands`` as the README gives them, the cluster named ``name``: ``k3deploy`` and
    ``pyinfra`` run this interpreter (the tests' way, :data:`helpers.K3DEPLOY`), the venv's activation is this
    interpreter's bin folder where the clone has no ``.venv``; after each command a line ``@@ <index> <exit>``."""
    py = shlex.quote(sys.executable)
    lines = ["set -u",
             f'k3deploy() {{ {py} -c "from k3deploy.cli import main; main()" "$@"; }}',
             f'pyinfra() {{ {py} -m pyinfra "$@"; }}']
    for i, command in enumerate(commands):
        if command.startswith("NAME="):
            command = f"NAME={shlex.quote(name)}"
        elif command.startswith("source .venv/bin/activate") and not (ROOT / ".venv/bin/activate").exists():
            command = f'export PATH={shlex.quote(str(BIN))}:"$PATH"'
        lines += [command, f'echo "{MARK} {i} $?"']
    return "\n".join(lines) + "\n"


def exits(output: str) -> dict[int, int]:
    """The exit code of each command (by index) that the script's output records."""
    return {int(m[1]): int(m[2]) for m in re.finditer(rf"^{MARK} (\d+) (\d+)$", output, re.M)}


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m[1]) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def broken_links() -> list[str]:
    """Every relative link of the README and docs/ whose file (or heading anchor) does not exist."""
    bad = []
    for path in markdown_files():
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue   # http(s), mailto: not this test's
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            where = f"{path.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                bad.append(f"{where} no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{where} no heading #{anchor}")
    return bad
