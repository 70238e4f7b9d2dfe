"""The rule registry: one registered function per finding code.

A rule is a function of one context object, registered with :func:`rule` under the finding code it reports.
The registry binds the code: a rule reports through its context (``ctx.add`` / ``ctx.emit``), which stamps
the findings with the code of the rule running, so no function can report another rule's code.

Scopes (what a rule is called with):

* ``plan``: once per resolved plan, with a :class:`~k3deploy.recipe.lint.context.PlanContext`;
* ``image``: once per image reference, with an :class:`~k3deploy.recipe.lint.images.ImageContext`;
* ``selection``: once per offered selection that does not resolve, with a
  :class:`~k3deploy.recipe.lint.rules_offering.SelectionContext`.

    >>> from k3deploy.recipe.lint import registry
    >>> registry.rule_for("memory-fit").scope, registry.rule_for("image-vendor").scope
    ('plan', 'image')
    >>> "flag-unknown" in registry.codes()
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from k3deploy.recipe.lint.findings import SEVERITIES, Finding

SCOPES = ("plan", "image", "selection")

F = TypeVar("F", bound=Callable[..., None])


@dataclass(frozen=True)
class Rule:
    code: str
    scope: str
    func: Callable[[Any], None]

    @property
    def module(self) -> str:
        return self.func.__module__

    @property
    def summary(self) -> str:
        """The first line of the rule's docstring."""
        return (self.func.__doc__ or "").strip().split("\n", 1)[0]


_RULES: dict[str, Rule] = {}


def rule(code: str, *, scope: str = "plan") -> Callable[[F], F]:
    """Register the decorated function as the one rule that reports ``code``."""
    if scope not in SCOPES:
        raise ValueError(f"unknown rule scope {scope!r}: use one of {', '.join(SCOPES)}")

    def register(func: F) -> F:
        have = _RULES.get(code)
        if have is not None:
            raise ValueError(f"finding code {code!r} is already reported by {have.module}.{have.func.__name__}")
        _RULES[code] = Rule(code, scope, func)
        return func

    return register


def rules(scope: str | None = None) -> list[Rule]:
    """The registered rules (of one scope), in registration order."""
    return [r for r in _RULES.values() if scope is None or r.scope == scope]


def rule_for(code: str) -> Rule:
    return _RULES[code]


def codes() -> list[str]:
    """Every finding code the linter can report, sorted."""
    return sorted(_RULES)


class Emitter:
    """Collects the findings of the rules run on it (:func:`run` sets ``code`` to the running rule's)."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.code: str | None = None

    def emit(self, severity: str, message: str, fix: str, path: str | None = None,
             roles: Iterable[str] = ()) -> None:
        if self.code is None:
            raise RuntimeError("findings are reported by registered rules only (see k3deploy.recipe.lint.registry)")
        if severity not in SEVERITIES:
            raise ValueError(f"unknown severity {severity!r}")
        self.findings.append(Finding(severity, self.code, message, fix, path, tuple(roles)))


def run(scope: str, ctx: Emitter) -> list[Finding]:
    """Run every rule of ``scope`` on ``ctx``; returns its findings."""
    for r in rules(scope):
        ctx.code = r.code
        try:
            r.func(ctx)
        finally:
            ctx.code = None
    return ctx.findings
