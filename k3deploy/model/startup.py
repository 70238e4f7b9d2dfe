"""Where an engine start's time goes: its phases, from the engine's own log lines and the unit's start time.

An engine start is read from the journal of the unit's last invocation (:func:`k3deploy.model.commands.startup_lines`:
``K3_BEGIN=`` when systemd began to start the unit, then ``K3_START=`` each milestone line as ``journalctl -o
short-unix`` prints it: epoch seconds with microseconds, the host, the identifier, the message; ``K3_GATE=`` when the
deploy recorded it, once its group served). Each phase ends at a milestone line that vLLM 0.33 logs (the file and
line in each message's own ``[file.py:line]`` prefix, as 0.33's logs show them) and lasts from the milestone before
it, so that the phases add up to the start:

=============  =========================================================================================================
``container``  the unit's start (``ExecStartPre``, the container's creation) up to the engine's first log line
``rendezvous`` the engine's first line up to ``Starting to load model`` (``gpu_model_runner.py``): argument parsing,
               the torch process group's rendezvous of the nodes, NCCL's setup, the DP group's message queue
``weights``    up to ``Model loading took ... GiB memory and ... seconds`` (``gpu_model_runner.py``), else ``Loading
               weights took %.2f seconds`` (``model_executor/model_loader/default_loader.py``)
``compile``    up to ``torch.compile takes %.2f s in total`` (``compilation/monitor.py``; later releases:
               ``torch.compile and initial profiling/warmup run together took``); a cache **hit** where vLLM
               logged ``Directly load the compiled graph(s) for compile range ... from the cache``
               (``compilation/backends.py``), a **miss** where it logged ``Compiling a graph for ...``; neither:
               not known
``kv_cache``   up to ``Available KV cache memory`` (``v1/worker/gpu_worker.py``) or ``GPU KV cache size: N tokens``
               (``v1/core/kv_cache_utils.py``), whichever comes first: the memory profile and the KV cache
``graphs``     up to ``Graph capturing finished in %.0f secs, took %.2f GiB`` (``v1/worker/gpu_model_runner.py``)
``ready``      up to the API server's ``Application startup complete.`` (uvicorn, after ``init engine (profile,
               create kv cache, warmup model) took`` of ``v1/engine/core.py`` and ``Starting vLLM server on``,
               vllm-facts §11.1); a headless node serves no API: its start ends with its graphs
=============  =========================================================================================================

A phase whose milestone is not in the log (``--enforce-eager``: no compile, no graphs) is left out and the next one
spans its time. The log lines' own timestamps (``INFO 12-06 22:40:01``) have whole seconds only: the journal's are
used.

Under ``k3_launcher: slurm`` there is no journal: a start is read from its job step's output file
(:func:`k3deploy.model.commands.step_startup_lines`, ``K3_STEP=`` each line, ``K3_CLOCK=`` the node's clock), from
the launch script's own first line (:data:`STEP_BEGAN`, UTC with microseconds: the start's begin, as systemd's
``InactiveExitTimestamp`` is) on. There each line's time is vLLM's own stamp (``vllm/logger.py`` of 0.33:
``_FORMAT = "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"``, ``_DATE_FORMAT = "%m-%d
%H:%M:%S"``: the local time to the second, no milliseconds, no year): real on every site with nothing between
the engine and its output file (a filter that stamped each line would stand between Slurm's SIGTERM and the
engine, and between the engine's exit code and the step's), and exact to a second against phases that take
minutes on a real cluster (a 1.5 TB checkpoint's weights, ~70 s of compile, ~60 s of graphs); the year and the
UTC offset are the node's clock's when the lines were read, and uvicorn's ready line, which vLLM does not stamp,
takes the time of the line before it.

Pure: the runtime reads the lines (``k3deploy status``, the revision's ``startup-<unit>.log`` that ``history``
lists).

Example::

    >>> lines = ["K3_BEGIN=Sun 2026-12-06 22:40:00.000000 UTC",
    ...          "K3_START=1796596801.500000 n1 docker[7]: INFO 12-06 22:40:01 [utils.py:253] non-default args: {}",
    ...          "K3_START=1796596803.000000 n1 docker[7]: INFO 12-06 22:40:03 [gpu_model_runner.py:3120] "
    ...          "Starting to load model m...",
    ...          "K3_START=1796596810.250000 n1 docker[7]: INFO 12-06 22:40:10 [default_loader.py:384] "
    ...          "Loading weights took 7.25 seconds",
    ...          "K3_START=1796596812.000000 n1 docker[7]: INFO:     Application startup complete."]
    >>> s = parse(lines)
    >>> s.seconds
    {'container': 1.5, 'rendezvous': 1.5, 'weights': 7.25, 'ready': 1.75}
    >>> s.total, s.complete, s.compile_cache
    (12.0, True, None)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: the phases of a start, in the order they run
PHASES: tuple[str, ...] = ("container", "rendezvous", "weights", "compile", "kv_cache", "graphs", "ready")

#: the line marks of :func:`k3deploy.model.commands.startup_lines`
BEGIN, LINE, GATE = "K3_BEGIN=", "K3_START=", "K3_GATE="
#: the marks of :func:`k3deploy.model.commands.step_startup_lines` (a Slurm job step's output): a line of the
#: engine's as it logged it, and the node's clock when it was read (epoch seconds, its UTC offset ``+HHMM``)
STEP, CLOCK = "K3_STEP=", "K3_CLOCK="
#: a step of the node's stage as the start record keeps it (:func:`k3deploy.model.steps.timed_stage`): its name,
#: when it began and when it ended (epoch seconds)
STAGE = "K3_STAGE="
#: what a Slurm launch script prints first (:func:`k3deploy.model.slurm.launch_script`), then the time in UTC with
#: microseconds (``date -u +%Y-%m-%dT%H:%M:%S.%6NZ``): where a start begins in its step's output
STEP_BEGAN = "k3deploy: the step began at "

#: a vLLM log line (``INFO 12-06 22:40:01 [file.py:12] ...``, after a ``(EngineCore_DP0 pid=79)`` prefix or not), or
#: uvicorn's line that the API serves: the lines :func:`k3deploy.model.commands.startup_lines` keeps
ENGINE_LINE = r"(INFO|WARNING|ERROR|DEBUG) [0-9]{2}-[0-9]{2} [0-9:]{8} \[|Application startup complete"

#: each phase's end: the patterns of its milestone lines (the first that matches ends it; ``weights`` ends at its
#: last milestone)
MILESTONES: dict[str, tuple[str, ...]] = {
    "rendezvous": ("Starting to load model",),
    "weights": ("Loading weights took", "Model loading took"),
    "compile": ("torch.compile takes", "torch.compile and initial profiling/warmup run together took"),
    "kv_cache": ("GPU KV cache size:", "Available KV cache memory:"),
    "graphs": ("Graph capturing finished in",),
    "ready": ("Application startup complete.",),
}
#: a compile cache hit / miss, as vLLM's compilation backend logs it
HIT, MISS = "Directly load the compiled graph(s)", "Compiling a graph for"
#: the API server's ready line (uvicorn's)
READY_MARK = MILESTONES["ready"][0]
#: the engine core's line once it is initialised (a headless node logs none)
CORE = "init engine (profile, create kv cache, warmup model)"


def ere(text: str) -> str:
    """``text`` as a POSIX extended regular expression that matches it, without backslashes (``awk -v`` reads
    those as escapes).

    >>> ere("graph(s) took 1.5")
    'graph[(]s[)] took 1[.]5'
    """
    return "".join(f"[{c}]" if c in ".()[]*+?{}|$" else c for c in text)


#: what the journal keeps of the milestones (an ERE: every milestone, the compile cache's lines, the engine core's)
KEPT = "|".join(ere(m) for m in (*(m for ms in MILESTONES.values() for m in ms), HIT, MISS, CORE))
#: the API server's line once the engine serves: the last line a start is read to
READY = ere("Application startup complete")

_JOURNAL = re.compile(r"^(\d+(?:\.\d+)?) \S+ \S+?: (.*)$")
#: vLLM 0.33's own stamp (``vllm/logger.py``: ``_FORMAT = "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d]
#: %(message)s"``, ``_DATE_FORMAT = "%m-%d %H:%M:%S"``: local time, whole seconds, no year), after a process prefix
#: (``(EngineCore_DP0 pid=79) ``) or not
_STAMPED = re.compile(r"(?:INFO|WARNING|ERROR|DEBUG) ([0-9]{2})-([0-9]{2}) ([0-9]{2}):([0-9]{2}):([0-9]{2}) \[")


def logged_at(line: str, now: float, offset: str = "+0000") -> float | None:
    """The epoch seconds of a vLLM log line's own stamp (``MM-DD HH:MM:SS``, the node's local time at UTC ``offset``),
    in the year that puts it at or before ``now`` (the time it was read: a line of 12-31 read on 01-01 is last
    year's); None: a line without vLLM's stamp.

    >>> logged_at("INFO 12-06 22:40:01 [utils.py:253] non-default args: {}", 1796596900.0)
    1796596801.0
    >>> logged_at("(EngineCore_DP0 pid=7) INFO 12-31 23:59:59 [core.py:1] x", 1798761700.0)   # 2027-01-01
    1798761599.0
    >>> logged_at("INFO 12-06 23:40:01 [utils.py:253] x", 1796596900.0, "+0100")
    1796596801.0
    >>> logged_at("INFO:     Application startup complete.", 1.0) is None
    True
    """
    m = _STAMPED.search(line)
    if m is None:
        return None
    month, day, hour, minute, second = (int(g) for g in m.groups())
    sign = -1 if offset.startswith("-") else 1
    digits = offset.lstrip("+-")
    shift = sign * (int(digits[:2] or 0) * 3600 + int(digits[2:4] or 0) * 60) if digits.isdigit() else 0
    year = datetime.fromtimestamp(now, UTC).year
    for y in (year, year - 1):
        try:
            when = datetime(y, month, day, hour, minute, second, tzinfo=UTC).timestamp() - shift
        except ValueError:   # 02-29 of a year without it
            continue
        if when <= now + 60:
            return when
    return None


@dataclass(frozen=True)
class Startup:
    """One start of one unit: when systemd began it (epoch seconds), each phase's start (seconds after ``begun``) and
    length, the compile cache (``hit``, ``miss``, None: not logged), when the deploy recorded it (``gate``: its group
    served; None: not recorded), and whether it reached its last phase (``ready``; a headless node: its graphs)."""

    begun: float | None = None
    phases: tuple[tuple[str, float, float], ...] = ()     # (phase, start, seconds)
    compile_cache: str | None = None
    gate: float | None = None
    complete: bool = False
    stage: tuple[tuple[str, float, float], ...] = ()      # the node's stage steps toward it: (step, began, ended)

    @property
    def seconds(self) -> dict[str, float]:
        """``{phase: seconds}``, in the order the phases ran."""
        return {name: length for name, _, length in self.phases}

    @property
    def stage_seconds(self) -> dict[str, float]:
        """``{step: seconds}`` of the node's stage toward this start, in the order the steps ran (empty: the stage
        did nothing on the node)."""
        return {name: round(ended - began, 3) for name, began, ended in self.stage}

    @property
    def total(self) -> float:
        """From the unit's start to the end of its last phase."""
        return round(sum(length for _, _, length in self.phases), 3)

    def to_dict(self) -> dict[str, Any]:
        """What ``status --json`` and ``history --json`` carry: ``{phase: seconds}`` as ``startup``, with when each
        began and the cache."""
        return {"startup": self.seconds, "startup_total": self.total, "startup_begun": self.begun,
                "startup_offsets": {name: start for name, start, _ in self.phases}, "compile_cache": self.compile_cache,
                "startup_complete": self.complete, "gate": self.gate, "stage": self.stage_seconds,
                "stage_times": {name: [began, ended] for name, began, ended in self.stage}}

    def line(self) -> str:
        """One line for people: ``weights 7.2s, compile 3.1s (cache hit), ... = 12.0s``, after the node's stage
        where it did something (``stage image 4.1s, weights 9.0s = 13.1s; start ...``)."""
        staged = (f"stage {', '.join(f'{n} {v:.1f}s' for n, v in self.stage_seconds.items())} = "
                  f"{sum(self.stage_seconds.values()):.1f}s; start " if self.stage else "")
        return staged + describe(self.seconds, self.compile_cache) + ("" if self.complete or not self.phases else
                                                                      " (not ready)")


def describe(seconds: Mapping[str, float], compile_cache: str | None = None) -> str:
    """A start's phases for people.

    >>> describe({"container": 0.71, "weights": 2.1, "compile": 0.45}, "hit")
    'container 0.7s, weights 2.1s, compile 0.5s (cache hit) = 3.3s'
    """
    if not seconds:
        return "no start phases logged"
    parts = [f"{name} {length:.1f}s" + (f" (cache {compile_cache})" if name == "compile" and compile_cache else "")
             for name, length in seconds.items()]
    return ", ".join(parts) + f" = {sum(seconds.values()):.1f}s"


def begun_at(text: str) -> float | None:
    """systemd's ``--timestamp=us+utc`` (``Sun 2026-12-06 22:40:00.000000 UTC``) as epoch seconds; None: empty or not
    one.

    >>> begun_at("Sun 2026-12-06 22:40:00.250000 UTC")
    1796596800.25
    >>> begun_at("n/a") is None
    True
    """
    text = text.strip()
    try:
        when = datetime.strptime(text, "%a %Y-%m-%d %H:%M:%S.%f UTC")
    except ValueError:
        return None
    return when.replace(tzinfo=UTC).timestamp()


def _clock(text: str) -> tuple[float, str] | None:
    """``K3_CLOCK=``'s epoch seconds and UTC offset; None: not one."""
    words = text.split()
    try:
        return (float(words[0]), words[1]) if len(words) == 2 else None
    except ValueError:
        return None


def _began(text: str) -> float | None:
    """:data:`STEP_BEGAN`'s time (``2026-12-06T09:00:00.000000Z``) as epoch seconds; None: not one.

    >>> _began("2026-12-06T22:40:00.250000Z")
    1796596800.25
    """
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def _phase_of(message: str) -> str | None:
    for name, marks in MILESTONES.items():
        if any(m in message for m in marks):
            return name
    return None


def parse(lines: Iterable[str], *, headless: bool | None = None) -> Startup:
    """The start that ``lines`` (``K3_BEGIN=``, ``K3_START=``, ``K3_GATE=``; a job step's ``K3_STEP=`` and
    ``K3_CLOCK=``; other lines are skipped) show.
    ``headless``: the unit serves no API, so its start is complete at its graphs (or its KV cache, where it captures
    none; None: judged from the lines, a start recorded once its group served, ``K3_GATE=``, that has no API
    server's line is a headless node's)."""
    begun: float | None = None
    gate: float | None = None
    timed: list[tuple[float, str]] = []
    staged: dict[str, tuple[float, float]] = {}
    lines = list(lines)
    clock = next((c for raw in lines if raw.startswith(CLOCK) and (c := _clock(raw[len(CLOCK):])) is not None), None)
    for raw in lines:
        if raw.startswith(STEP):
            text = raw[len(STEP):]
            if text.startswith(STEP_BEGAN):
                begun = _began(text[len(STEP_BEGAN):])
            elif clock is not None and (when := logged_at(text, *clock)) is not None:
                timed.append((when, text))
            elif timed and READY_MARK in text:   # uvicorn's own line, without vLLM's stamp: its line before
                timed.append((timed[-1][0], text))
        elif raw.startswith(STAGE):
            step = _stage_step(raw[len(STAGE):])
            if step is not None:
                staged.pop(step[0], None)   # the last of a step's lines (in the order it ran)
                staged[step[0]] = step[1:]
        elif raw.startswith(BEGIN):
            begun = begun_at(raw[len(BEGIN):])
        elif raw.startswith(GATE):
            try:
                gate = float(raw[len(GATE):].strip())
            except ValueError:
                gate = None
        elif raw.startswith(LINE) and (m := _JOURNAL.match(raw[len(LINE):].strip())):
            timed.append((float(m.group(1)), m.group(2)))
    stage = tuple((name, began, ended) for name, (began, ended) in staged.items())
    if not timed:
        return Startup(begun=begun, gate=gate, stage=stage)
    origin = begun if begun is not None and begun <= timed[0][0] else timed[0][0]
    ends: dict[str, float] = {}
    cache: str | None = None
    for when, message in timed:
        name = _phase_of(message)
        if HIT in message:
            cache = "hit"
        elif MISS in message and cache is None:
            cache = "miss"
        if name is None:
            continue
        if name == "weights" or name not in ends:
            ends[name] = when
    marks = [("container", timed[0][0])] + [(n, ends[n]) for n in PHASES[1:] if n in ends]
    phases: list[tuple[str, float, float]] = []
    previous = origin
    for name, end in marks:
        end = max(end, previous)
        phases.append((name, round(previous - origin, 3), round(end - previous, 3)))
        previous = end
    if headless is None:   # a start the deploy recorded once its group served, without an API: a headless node's
        headless = "ready" not in ends and gate is not None
    complete = "ready" in ends or (headless and ("graphs" in ends or "kv_cache" in ends))
    return Startup(begun=origin, phases=tuple(phases), compile_cache=cache, gate=gate, complete=complete,
                   stage=stage)


def _stage_step(text: str) -> tuple[str, float, float] | None:
    """A ``K3_STAGE=`` line's step, begin and end; None: not one (or one that ended before it began).

    >>> _stage_step("weights 1796596700.25 1796596760.5")
    ('weights', 1796596700.25, 1796596760.5)
    >>> _stage_step("weights x y") is None
    True
    """
    words = text.split()
    try:
        step = (words[0], float(words[1]), float(words[2])) if len(words) == 3 else None
    except ValueError:
        return None
    return step if step is not None and step[2] >= step[1] else None


def from_dict(data: Mapping[str, Any]) -> Startup:
    """A :meth:`Startup.to_dict` read back (``history --json``, ``status --json``).

    >>> s = parse(["K3_START=10.0 n d[1]: INFO 12-06 22:40:01 [utils.py:1] x",
    ...            "K3_START=12.5 n d[1]: INFO 12-06 22:40:03 [gpu_model_runner.py:1] Starting to load model m"])
    >>> from_dict(s.to_dict()) == s
    True
    """
    offsets = data.get("startup_offsets") or {}
    phases = tuple((str(n), float(offsets.get(n, 0.0)), float(v)) for n, v in (data.get("startup") or {}).items())
    stage = tuple((str(n), float(t[0]), float(t[1])) for n, t in (data.get("stage_times") or {}).items())
    return Startup(begun=data.get("startup_begun"), phases=phases, compile_cache=data.get("compile_cache"),
                   gate=data.get("gate"), complete=bool(data.get("startup_complete")), stage=stage)


def recorded(starts: Mapping[str, Mapping[str, Iterable[str]]]) -> dict[str, dict[str, Startup]]:
    """Each unit's start as a revision recorded it (``{host: {unit: lines}}``) -> ``{host: {unit: Startup}}``.

    >>> recorded({"n1": {"k3-engine.service": ["K3_START=10.0 n d[1]: INFO 12-06 22:40:01 [utils.py:1] x"]}})
    {'n1': {'k3-engine.service': Startup(begun=10.0, phases=(('container', 0.0, 0.0),), compile_cache=None, \
gate=None, complete=False, stage=())}}
    """
    return {host: {unit: parse(lines) for unit, lines in sorted(units.items())}
            for host, units in sorted(starts.items())}
