"""Shared machinery for the k3deploy host facts.

Every fact runs one shell command whose exit status is appended to stdout as a last line
``K3_EXIT=<status>``. pyinfra then always sees a successful command with output, so a tool that
fails (``nvidia-smi`` without a loaded driver exits 9) does not mark the host failed and
``process()`` is always called. ``process()`` never raises: it returns either the fact's typed value
or a :class:`FactError` that says what went wrong:

* ``absent``: the tool (or file) is missing. pyinfra's ``requires_command`` guard yields the fact's
  ``default()``, which is such a value; commands that probe for files print ``K3_ABSENT=<what>``.
* ``failed``: the tool ran and exited non-zero; ``first_line`` shows what it printed.
* ``unparsable``: exit 0, but the output does not have the documented shape.

Multi-part commands separate their parts with ``K3_SECTION=<name>`` lines (see :func:`sections`).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal, TypeVar

from pyinfra.api.facts import FactBase

#: seconds a vendor tool may run before it is stopped (``nvidia-smi`` can hang on a GPU in a bad state)
FACT_TIMEOUT_S = 60
#: exit status of ``timeout`` when it stopped the command
TIMED_OUT = 124

EXIT_MARK = "K3_EXIT="
ABSENT_MARK = "K3_ABSENT="
SECTION_MARK = "K3_SECTION="

T = TypeVar("T")


class Unparsable(ValueError):
    """Raised by the pure parse functions when output does not have the expected shape."""


class Jsonable:
    """Fact values serialise themselves for ``pyinfra ... fact ... --json`` (pyinfra calls ``to_json``)."""

    def to_json(self) -> Any:
        return asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True)
class FactError(Jsonable):
    """A fact that could not be read.

    >>> FactError(kind="absent", tool="nvidia-smi", command="nvidia-smi -q",
    ...           hint="is the NVIDIA driver installed?").message("10.77.0.12")
    'nvidia-smi not found on 10.77.0.12: is the NVIDIA driver installed?'
    """

    kind: Literal["absent", "failed", "unparsable"]
    tool: str
    command: str
    first_line: str = ""
    exit_code: int | None = None
    hint: str = ""
    reason: str = ""

    def message(self, host: str) -> str:
        if self.kind == "absent":
            text = f"{self.tool} not found on {host}"
            return f"{text}: {self.hint}" if self.hint else text
        if self.kind == "failed" and self.exit_code == TIMED_OUT:
            return f"`{self.command}` did not finish within {FACT_TIMEOUT_S} s on {host}: the tool hangs"
        if self.kind == "failed":
            text = f"`{self.command}` failed on {host} (exit {self.exit_code})"
            if self.first_line:
                text += f": {self.first_line}"
            return f"{text}; {self.hint}" if self.hint else text
        shown = self.first_line if self.first_line else "(empty output)"
        text = f"cannot parse the output of `{self.command}` on {host}"
        if self.reason:
            text += f" ({self.reason})"
        return f"{text}; first line: {shown!r}"


def wrap(command: str) -> str:
    """Run ``command`` under ``timeout``, stderr folded into stdout, its exit status appended.

    >>> wrap("uname -r")
    'timeout 60 uname -r 2>&1; echo K3_EXIT=$?'
    """
    return f"timeout {FACT_TIMEOUT_S} {command} 2>&1; echo {EXIT_MARK}$?"


def split_exit(output: list[str]) -> tuple[list[str], int | None]:
    """Separate the trailing ``K3_EXIT=`` line: ``(lines, status)``; status None if it is missing.

    >>> split_exit(["6.8.0-45-generic", "K3_EXIT=0"])
    (['6.8.0-45-generic'], 0)
    """
    lines = list(output)
    while lines and not lines[-1].strip():
        lines.pop()
    if lines and lines[-1].strip().startswith(EXIT_MARK):
        value = lines.pop().strip()[len(EXIT_MARK) :]
        try:
            return lines, int(value)
        except ValueError:
            return lines, None
    return lines, None


def sections(lines: list[str]) -> dict[str, list[str]]:
    """Split output at ``K3_SECTION=<name>`` lines; lines before the first marker go to ``""``.

    >>> sections(["K3_SECTION=state", "active", "K3_SECTION=version", "580.95.05"])
    {'': [], 'state': ['active'], 'version': ['580.95.05']}
    """
    out: dict[str, list[str]] = {"": []}
    current = ""
    for line in lines:
        stripped = line.strip()
        if stripped.startswith(SECTION_MARK):
            current = stripped[len(SECTION_MARK) :]
            out[current] = []
        else:
            out[current].append(line)
    return out


def first_line(lines: list[str]) -> str:
    for line in lines:
        if line.strip():
            return line.strip()[:200]
    return ""


_VERSION_PART = re.compile(r"\d+")


def version_key(version: str) -> tuple[int, ...]:
    """Integer tuple of the leading numeric components: compare versions with this, never as strings.

    >>> version_key("580.126.09") > version_key("580.65.06")
    True
    >>> version_key("25.3.rc1")
    (25, 3)
    """
    parts: list[int] = []
    for piece in version.strip().split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    if not parts:
        match = _VERSION_PART.match(version.strip())
        if match:
            parts.append(int(match.group()))
    return tuple(parts)


def version_at_least(version: str, floor: str) -> bool:
    have, want = version_key(version), version_key(floor)
    width = max(len(have), len(want))
    return have + (0,) * (width - len(have)) >= want + (0,) * (width - len(want))


class K3Fact(FactBase[T]):
    """Base class: subclasses set ``tool``, ``hint`` and ``shown_command`` and implement ``parse``.

    ``parse(lines)`` receives the output without the ``K3_EXIT`` line and is only called for exit 0
    (override ``parse_result`` to see the exit status too). It may raise :class:`Unparsable`,
    ``ValueError``, ``IndexError`` or ``KeyError``; those become a ``FactError('unparsable')``.
    """

    abstract = True
    #: binary that must exist on the host; None when the command probes for files itself
    tool: ClassVar[str] = ""
    #: question shown after "<tool> not found on <host>: "
    hint: ClassVar[str] = ""
    #: command as shown to the user in error messages (without the K3 wrapping)
    shown_command: ClassVar[str] = ""
    #: name of the ``requires_command`` binary; empty when the fact needs none
    required_binary: ClassVar[str] = ""
    #: a line the tool prints (whatever its exit status) when there is nothing to list: the fact is then ``[]``
    nothing_found: ClassVar[str] = ""

    def requires_command(self, *args: Any, **kwargs: Any) -> str | None:
        return self.required_binary or None

    @classmethod
    def default(cls) -> FactError:  # type: ignore[override]
        """What pyinfra returns when ``requires_command`` is missing on the host."""
        return FactError(kind="absent", tool=cls.tool, command=cls.shown_command, hint=cls.hint)

    def error(self, kind: Literal["failed", "unparsable"], lines: list[str], **extra: Any) -> FactError:
        return FactError(
            kind=kind,
            tool=self.tool,
            command=self.shown_command,
            first_line=first_line(lines),
            hint=self.hint if kind == "failed" else "",
            **extra,
        )

    def process(self, output: list[str]) -> T | FactError:  # type: ignore[override]
        lines, status = split_exit(output)
        for line in lines:
            stripped = line.strip()
            if stripped.startswith(ABSENT_MARK):
                missing = stripped[len(ABSENT_MARK) :] or self.tool
                return FactError(kind="absent", tool=missing, command=self.shown_command, hint=self.hint)
        if status == 127 and not any(line.strip() for line in lines[1:]):
            # "sh: 1: nvidia-smi: not found": the shell could not find the tool
            return FactError(kind="absent", tool=self.tool, command=self.shown_command, hint=self.hint)
        try:
            return self.parse_result(lines, status)
        except (Unparsable, ValueError, IndexError, KeyError) as exc:
            return self.error("unparsable", lines, reason=str(exc))

    def command(self, *args: Any, **kwargs: Any) -> str:
        """By default the fact runs ``shown_command`` as it is, wrapped (stderr folded in, exit status appended)."""
        return wrap(self.shown_command)

    def parse_result(self, lines: list[str], status: int | None) -> T | FactError:
        if self.nothing_found and any(line.strip().startswith(self.nothing_found) for line in lines):
            return []  # type: ignore[return-value]
        if status is None:
            raise Unparsable("no exit status: the command was cut short")
        if status != 0:
            return self.error("failed", lines, exit_code=status)
        return self.parse(lines)

    def parse(self, lines: list[str]) -> T:
        """Subclasses parse the tool's output here (see the class docstring)."""
        raise TypeError(f"{type(self).__name__} defines no parse()")
