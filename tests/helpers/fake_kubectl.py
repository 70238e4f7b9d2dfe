"""A ``kubectl`` for the offline test of the Kubernetes export's ``check.sh``: it answers the read-only commands
that script runs from a recorded cluster (``$K3_KUBECTL_CLUSTER``: a YAML file under ``tests/fixtures/kubectl/``
holding the server's ``/version`` answer and the cluster's objects, their sources in README.md there), as kubectl
would print them.

What it takes: ``get --raw /version``; ``get KIND [NAME] [-A] [-n NS] [-l KEY[=VALUE]] -o name|jsonpath=TEMPLATE``
with the JSONPath kubectl's ``get`` uses (fields with ``\\.`` escapes, ``[*]``, ``[N]``, ``{range}..{end}``, quoted
literals; a missing field prints nothing, a list or map prints as compact JSON). An object that is not there is
kubectl's NotFound line on stderr and exit 1; any other command is refused (exit 2), so that a check which runs
something the recording cannot answer fails loudly.

Run as a program (``python3 fake_kubectl.py ARGS``, on PATH as ``kubectl``)::

    >>> render("{range .items[*]}{.metadata.name}{\\"\\\\n\\"}{end}", {"items": [{"metadata": {"name": "a"}}]})
    'a\\n'
    >>> render("{.a.b\\\\.c} {.l}", {"a": {"b.c": 1}, "l": ["x", "y"]})
    '1 ["x","y"]'
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

import yaml

#: kubectl's names of a kind -> (the kind, its resource with its group as NotFound prints it, the group of -o name)
KINDS: dict[str, tuple[str, str, str]] = {}
for names, kind, resource, group in (
    (("crd", "crds", "customresourcedefinition", "customresourcedefinitions"), "CustomResourceDefinition",
     "customresourcedefinitions.apiextensions.k8s.io", "customresourcedefinition.apiextensions.k8s.io"),
    (("node", "nodes", "no"), "Node", "nodes", "node"),
    (("daemonset", "daemonsets", "ds"), "DaemonSet", "daemonsets.apps", "daemonset.apps"),
    (("namespace", "namespaces", "ns"), "Namespace", "namespaces", "namespace"),
    (("secret", "secrets"), "Secret", "secrets", "secret"),
    (("pvc", "persistentvolumeclaim", "persistentvolumeclaims"), "PersistentVolumeClaim",
     "persistentvolumeclaims", "persistentvolumeclaim"),
    (("deviceclass", "deviceclasses"), "DeviceClass", "deviceclasses.resource.k8s.io",
     "deviceclass.resource.k8s.io"),
):
    for name in names:
        KINDS[name] = (kind, resource, group)
#: the kinds that live in a namespace
NAMESPACED = {"DaemonSet", "Secret", "PersistentVolumeClaim"}


def _steps(path: str) -> list[tuple[str, str | None]]:
    """``.a.b\\.c[*]`` -> ``[("a", None), ("b.c", "*")]``."""
    out: list[tuple[str, str | None]] = []
    for part in re.split(r"(?<!\\)\.", path.strip())[1:]:
        m = re.fullmatch(r"(.*?)(?:\[(\*|\d+)\])?", part, re.S)
        assert m is not None
        out.append((m.group(1).replace("\\.", "."), m.group(2)))
    return out


def evaluate(path: str, node: Any) -> list[Any]:
    found = [node]
    for name, index in _steps(path):
        nxt: list[Any] = []
        for value in found:
            if name:
                if not isinstance(value, dict) or name not in value:
                    continue
                value = value[name]
            if index == "*":
                nxt += value if isinstance(value, list) else []
            elif index is not None:
                if isinstance(value, list) and int(index) < len(value):
                    nxt.append(value[int(index)])
            else:
                nxt.append(value)
        found = nxt
    return found


def _shown(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _tokens(template: str) -> list[tuple[str, str]]:
    """``("text", literal)`` and ``("expr", inside braces)`` in order."""
    out: list[tuple[str, str]] = []
    pos = 0
    for m in re.finditer(r"\{((?:\"(?:[^\"\\]|\\.)*\"|[^{}])*)\}", template):
        if m.start() > pos:
            out.append(("text", template[pos:m.start()]))
        out.append(("expr", m.group(1).strip()))
        pos = m.end()
    if pos < len(template):
        out.append(("text", template[pos:]))
    return out


def render(template: str, data: Any) -> str:
    """kubectl's JSONPath output of ``template`` over ``data``."""
    tokens = _tokens(template)

    def run(i: int, node: Any, out: list[str]) -> int:
        while i < len(tokens):
            kind, value = tokens[i]
            if kind == "text":
                out.append(value)
            elif value == "end":
                return i
            elif value.startswith("range "):
                items = evaluate(value[len("range "):], node)
                end = i
                for item in items:
                    end = run(i + 1, item, out)
                if not items:   # find the matching end without output
                    end = run(i + 1, None, [])
                i = end
            elif value.startswith('"'):
                out.append(json.loads(value))
            else:
                out.append(" ".join(_shown(v) for v in evaluate(value, node)))
            i += 1
        return i

    out: list[str] = []
    run(0, data, out)
    return "".join(out)


def _fail(text: str, code: int = 1) -> NoReturn:
    print(text, file=sys.stderr)
    sys.exit(code)


def main(argv: list[str]) -> None:
    cluster = yaml.safe_load(Path(os.environ["K3_KUBECTL_CLUSTER"]).read_text())
    if argv == ["get", "--raw", "/version"]:
        sys.stdout.write(cluster["version"])
        return
    if not argv or argv[0] != "get" or len(argv) < 2 or argv[1] not in KINDS:
        _fail(f"fake kubectl: no recorded answer for: kubectl {' '.join(argv)}", 2)
    kind, resource, group = KINDS[argv[1]]
    args = argv[2:]
    name = namespace = selector = output = None
    all_namespaces = False
    while args:
        a = args.pop(0)
        if a in ("-A", "--all-namespaces"):
            all_namespaces = True
        elif a in ("-n", "--namespace"):
            namespace = args.pop(0)
        elif a in ("-l", "--selector"):
            selector = args.pop(0)
        elif a in ("-o", "--output"):
            output = args.pop(0)
        elif a.startswith("-o"):
            output = a[2:]
        elif not a.startswith("-") and name is None:
            name = a
        else:
            _fail(f"fake kubectl: no recorded answer for: kubectl {' '.join(argv)}", 2)
    objects = [o for o in cluster["objects"] if o["kind"] == kind]
    if kind in NAMESPACED and not all_namespaces:
        objects = [o for o in objects if o["metadata"].get("namespace") == (namespace or "default")]
    if selector is not None:
        key, _, want = selector.partition("=")
        objects = [o for o in objects if key in o["metadata"].get("labels", {})
                   and (not want or o["metadata"]["labels"][key] == want)]
    if name is not None:
        objects = [o for o in objects if o["metadata"]["name"] == name]
        if not objects:
            _fail(f'Error from server (NotFound): {resource} "{name}" not found')
    if output == "name":
        sys.stdout.write("".join(f"{group}/{o['metadata']['name']}\n" for o in objects))
        return
    if output is None or not output.startswith("jsonpath="):
        _fail(f"fake kubectl: no recorded answer for: kubectl {' '.join(argv)}", 2)
    if name is None and not objects:
        print("No resources found", file=sys.stderr)
    data = objects[0] if name is not None else {"apiVersion": "v1", "kind": "List", "items": objects}
    sys.stdout.write(render(output[len("jsonpath="):], data))


if __name__ == "__main__":
    main(sys.argv[1:])
