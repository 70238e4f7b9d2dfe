"""A small subset of Go's text/template, as used by ``docker ... --format``.

Supports ``{{.A.B}}``, ``{{json .X}}``, ``{{index .X 0}}``, ``{{join .X ","}}``, ``{{len .X}}``,
``{{lower/upper X}}``, ``{{range [$k, $v :=] PIPE}}...{{end}}``, ``{{if PIPE}}...{{else}}...{{end}}``,
trim markers (``{{-``/``-}}``) and variables ``$`` / ``$k`` / ``$v``.
"""

from __future__ import annotations

import json
import re
import shlex

_ACTION = re.compile(r"{{(-?)\s*(.*?)\s*(-?)}}", re.S)


class TemplateError(Exception):
    pass


def _tokens(tpl: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    for m in _ACTION.finditer(tpl):
        text = tpl[pos:m.start()]
        if m.group(1):
            text = text.rstrip()
        if out and out[-1][0] == "trim":
            out.pop()
            text = text.lstrip()
        out.append(("text", text))
        out.append(("action", m.group(2)))
        if m.group(3):
            out.append(("trim", ""))
        pos = m.end()
    text = tpl[pos:]
    if out and out[-1][0] == "trim":
        out.pop()
        text = text.lstrip()
    out.append(("text", text))
    return out


def _parse(tokens: list[tuple[str, str]], i: int, stop: tuple[str, ...]) -> tuple[list, int, str]:
    nodes: list = []
    while i < len(tokens):
        kind, val = tokens[i]
        if kind == "text":
            nodes.append(("text", val))
            i += 1
            continue
        word = val.split(None, 1)[0] if val else ""
        if word in stop:
            return nodes, i, word
        if word == "range":
            body, i, end = _parse(tokens, i + 1, ("end", "else"))
            alt: list = []
            if end == "else":
                alt, i, end = _parse(tokens, i + 1, ("end",))
            nodes.append(("range", val[5:].strip(), body, alt))
            i += 1
        elif word == "if":
            body, i, end = _parse(tokens, i + 1, ("end", "else"))
            alt = []
            if end == "else":
                alt, i, end = _parse(tokens, i + 1, ("end",))
            nodes.append(("if", val[2:].strip(), body, alt))
            i += 1
        else:
            nodes.append(("expr", val))
            i += 1
    if stop:
        raise TemplateError("unexpected EOF")
    return nodes, i, ""


def _lookup(data, path: str):
    cur = data
    for part in [p for p in path.split(".") if p]:
        if isinstance(cur, dict):
            if part not in cur:
                raise TemplateError(f"can't evaluate field {part}")
            cur = cur[part]
        else:
            raise TemplateError(f"can't evaluate field {part}")
    return cur


def _arg(tok: str, dot, env: dict):
    if tok.startswith(("\"", "'")):
        return tok[1:-1]
    if re.fullmatch(r"-?\d+", tok):
        return int(tok)
    if tok.startswith("$"):
        name, _, rest = tok.partition(".")
        if name not in env:
            raise TemplateError(f"undefined variable: {name}")
        return _lookup(env[name], rest) if rest else env[name]
    if tok.startswith("."):
        return _lookup(dot, tok)
    raise TemplateError(f"function \"{tok}\" not defined")


def _eval(expr: str, dot, env: dict):
    try:
        toks = shlex.split(expr, posix=False)
    except ValueError as exc:
        raise TemplateError(str(exc)) from None
    if not toks:
        return ""
    fn, rest = toks[0], toks[1:]
    args = [_arg(t, dot, env) for t in rest]
    if fn == "json":
        return json.dumps(args[0] if args else dot, separators=(",", ":"))
    if fn == "index":
        cur = args[0]
        for key in args[1:]:
            try:
                cur = cur[key]
            except (IndexError, KeyError, TypeError):
                raise TemplateError(f"error calling index: index out of range: {key}") from None
        return cur
    if fn == "join":
        return args[1].join(str(x) for x in (args[0] or []))
    if fn == "len":
        return len(args[0] or [])
    if fn in ("lower", "upper"):
        return getattr(str(args[0]), fn)()
    if fn == "println":
        return " ".join(gofmt(a) for a in args) + "\n"
    if fn == "print":
        return "".join(gofmt(a) for a in args)
    if fn == "printf":
        fmt = str(args[0]).replace("%v", "%s").replace("%q", "\"%s\"")
        return fmt % tuple(gofmt(a) for a in args[1:])
    if rest:
        raise TemplateError(f"can't give argument to non-function {fn}")
    return _arg(fn, dot, env)


def gofmt(value) -> str:
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + " ".join(gofmt(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{gofmt(v)}" for k, v in sorted(value.items())) + "]"
    return str(value)


def _run(nodes: list, dot, env: dict, out: list[str]) -> None:
    for node in nodes:
        kind = node[0]
        if kind == "text":
            out.append(node[1])
        elif kind == "expr":
            out.append(gofmt(_eval(node[1], dot, env)))
        elif kind == "if":
            val = _eval(node[1], dot, env)
            _run(node[2] if val not in (None, False, 0, "", [], {}) else node[3], dot, env, out)
        elif kind == "range":
            spec = node[1]
            names: list[str] = []
            if ":=" in spec:
                left, spec = spec.split(":=", 1)
                names = [n.strip() for n in left.split(",")]
            coll = _eval(spec.strip(), dot, env)
            items = sorted(coll.items()) if isinstance(coll, dict) else list(enumerate(coll or []))
            if not items:
                _run(node[3], dot, env, out)
            for key, val in items:
                sub = dict(env)
                if len(names) == 2:
                    sub[names[0]], sub[names[1]] = key, val
                elif len(names) == 1:
                    sub[names[0]] = val
                _run(node[2], val, sub, out)


def render(tpl: str, data) -> str:
    nodes, _, _ = _parse(_tokens(tpl), 0, ())
    out: list[str] = []
    _run(nodes, data, {"$": data}, out)
    return "".join(out)
