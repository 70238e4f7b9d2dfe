"""A runbook before the nodes answer: what the rollout would read from each node appears as a named blank, with
the command (run on that node) that finds its value.

Example::

    >>> b = Blank("gb300-node1", "IFACE", "the interface carrying 10.0.0.11", "ip -o -4 addr show")
    >>> b.token
    '@IFACE_gb300_node1@'
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from k3deploy.model.requirements import Requirements
from k3deploy.model.secrets import is_secret
from k3deploy.vendors import pack_for


@dataclass(frozen=True)
class Blank:
    host: str
    name: str
    what: str
    command: str

    @property
    def token(self) -> str:
        """The placeholder written where the value goes (greppable, never a valid value)."""
        return f"@{self.name}_{re.sub(r'[^A-Za-z0-9]', '_', self.host)}@"


def interface_command(address: str) -> str:
    """Prints the interface that carries ``address`` on the node."""
    return f"ip -o -4 addr show | awk -v a={shlex.quote(address)} '{{split($4, x, \"/\")}} x[1] == a {{print $2}}'"


HCA_COMMAND = ("ibv_devinfo | awk '/hca_id:/ {d=$2} /port:/ {p=$2} "
               "/PORT_ACTIVE/ {printf \"%s%s:%s\", s, d, p; s=\",\"}' | sed 's/^/=/'")


def offline_env(req: Requirements, host: str, address: str,
                iface_setting: str | None = None) -> tuple[dict[str, str], list[Blank]]:
    """The env settings the rollout derives from a node's facts (the vendor pack's
    :class:`~k3deploy.vendors.base.Transport`), as blanks (and the blanks themselves); the socket interface is
    ``iface_setting`` (``k3_iface``) when given, in NCCL's exact-match form (``=NAME``) where the pack says so.

    >>> from k3deploy.recipe.taxonomy import hardware
    >>> need = Requirements(hardware()["h200"], "default", None, nodes=2, multi_node=True)
    >>> env, _ = offline_env(need, "n1", "10.0.0.11")
    >>> env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"]
    ('=@IFACE_n1@', '@IFACE_n1@')
    >>> offline_env(need, "n1", "10.0.0.11", "bond0")[0]["NCCL_SOCKET_IFNAME"]
    '=bond0'
    """
    transport = pack_for(req).transport
    blanks: list[Blank] = []
    env: dict[str, str] = {}
    iface = Blank(host, "IFACE", f"the interface carrying {address}", interface_command(address))
    if iface_setting:
        name = iface_setting.lstrip("=")
    else:
        blanks.append(iface)
        name = iface.token
    for key in transport.socket_env:
        env[key] = ("=" if key in transport.exact_socket_env else "") + name
    if transport.address_env:
        env[transport.address_env] = address
    if req.mnnvl:
        for key in transport.nvlink_env:
            env[key] = "1"
    if req.needs_rdma and transport.rdma_ports:
        hca = Blank(host, "IB_HCA", "the RDMA ports with an active link, as NCCL_IB_HCA's exact-match list",
                    HCA_COMMAND)
        blanks.append(hca)
        env["NCCL_IB_HCA"] = hca.token
    return env, blanks


def secret_token(name: str) -> str:
    """The placeholder a runbook writes for a secret's value (greppable, never a valid value)."""
    return f"@SECRET_{name}@"


def secret_file(config_dir: str, name: str) -> str:
    """Where, on a node, the runbook reads a secret's value from: one file per secret, 0600, written by hand."""
    return f"{config_dir.rstrip('/')}/secrets/{name}"


def without_secrets(env_text: str) -> tuple[str, list[str]]:
    """An env file's text with each secret's value (:mod:`k3deploy.model.secrets`) replaced by its placeholder,
    and the secrets' names.

    >>> without_secrets("A=1\\nDB_PASSWORD=hunter2\\n")
    ('A=1\\nDB_PASSWORD=@SECRET_DB_PASSWORD@\\n', ['DB_PASSWORD'])
    """
    lines, names = [], []
    for line in env_text.splitlines(keepends=True):
        name, sep, _ = line.partition("=")
        if sep and is_secret(name):
            names.append(name)
            line = f"{name}={secret_token(name)}" + ("\n" if line.endswith("\n") else "")
        lines.append(line)
    return "".join(lines), names


def fill_secrets(env_path: str, names: list[str], config_dir: str) -> str:
    """Fill each secret's placeholder in the env file from its 0600 file on the node (:func:`secret_file`): the
    value goes from file to file, never through a command line or the terminal; a missing file stops the block
    with what to write where."""
    env, new = shlex.quote(env_path), shlex.quote(f"{env_path}.new")
    out = []
    for name in names:
        f = shlex.quote(secret_file(config_dir, name))
        why = shlex.quote(f"write the value of {name} to {secret_file(config_dir, name)} (mode 0600) first")
        out.append(f"[ -s {f} ] || {{ echo {why} >&2; exit 1; }}\n"
                   f"( umask 077 && awk -v n={shlex.quote(name)} -v f={f} 'BEGIN {{ getline s < f }} "
                   f"$0 == n \"={secret_token(name)}\" {{ $0 = n \"=\" s }} {{ print }}' {env} > {new} ) && "
                   f"mv -f {new} {env}\n")
    return "".join(out)
