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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from k3deploy.model.requirements import Requirements
from k3deploy.model.secrets import is_secret
from k3deploy.model.units import env_file_text
from k3deploy.vendors import pack_for
from k3deploy.vendors.base import HostAnswers


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


#: the blank of a node's RDMA ports (NCCL_IB_HCA, UCX_NET_DEVICES)
PORTS = "IB_HCA"
HCA_COMMAND = ("ibv_devinfo | awk '/hca_id:/ {d=$2} /port:/ {p=$2} "
               "/PORT_ACTIVE/ {printf \"%s%s:%s\", s, d, p; s=\",\"}'")


def offline_env(req: Requirements, host: str, address: str, iface_setting: str | None = None,
                ib_hca: str | None = None) -> tuple[dict[str, str], list[Blank]]:
    """The env settings the rollout derives from a node's facts, by the same derivation
    (:meth:`k3deploy.vendors.base.Transport.settings`) with blanks for what the node would answer (and the blanks
    themselves): the socket interface (``iface_setting``, ``k3_iface``, when given) and the RDMA ports (``ib_hca``,
    ``k3_ib_hca``, when it names each port: a device alone means its active ports, which only the node knows). What a
    host's facts decide beyond those, the vendor's GPU path to the ports, is assumed to be what passes preflight
    there, and said so (:func:`assumed`): DMA-BUF on NVIDIA (no ``NCCL_DMABUF_ENABLE``).

    >>> from k3deploy.recipe.taxonomy import hardware
    >>> need = Requirements(hardware()["h200"], "default", None, nodes=2, multi_node=True, pd=True)
    >>> env, _ = offline_env(need, "n1", "10.0.0.11")
    >>> env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"], env["NCCL_IB_HCA"], env["UCX_NET_DEVICES"]
    ('=@IFACE_n1@', '@IFACE_n1@', '=@IB_HCA_n1@', '@IB_HCA_n1@')
    >>> offline_env(need, "n1", "10.0.0.11", "bond0")[0]["NCCL_SOCKET_IFNAME"]
    '=bond0'
    >>> env, blanks = offline_env(need, "n1", "10.0.0.11", "bond0", "mlx5_0:1,mlx5_3:1")
    >>> env["NCCL_IB_HCA"], env["UCX_NET_DEVICES"], blanks
    ('=mlx5_0:1,mlx5_3:1', 'mlx5_0:1,mlx5_3:1', [])
    """
    transport = pack_for(req).transport
    blanks: list[Blank] = []
    if iface_setting:
        name, why = iface_setting.lstrip("="), "k3_iface"
    else:
        iface = Blank(host, "IFACE", f"the interface carrying {address}", interface_command(address))
        blanks.append(iface)
        name, why = iface.token, f"carries {address}"
    answers = HostAnswers(name, why, address, transport.nvlink(req.hardware))
    if req.needs_rdma and transport.rdma_ports and ib_hca and all(":" in p for p in ib_hca.split(",")):
        answers = replace(answers, ports=ib_hca, ports_why="k3_ib_hca")
    elif req.needs_rdma and transport.rdma_ports:
        hca = Blank(host, PORTS, "the RDMA ports with an active link (NCCL_IB_HCA after its =, UCX_NET_DEVICES)",
                    HCA_COMMAND)
        blanks.append(hca)
        answers = replace(answers, ports=hca.token, ports_why="RDMA ports with an active link")
    return {key: value for key, value, _ in transport.settings(answers, req.pd)}, blanks


def assumed(brand: str, blanks: Sequence[Blank]) -> list[str]:
    """What :func:`offline_env` assumed of each node instead of reading it, as the runbook says it: the vendor's GPU
    path to the RDMA ports (``Transport.gpu_path_assumed``), where the blanks read the ports.

    >>> from k3deploy.recipe.taxonomy import hardware
    >>> need = Requirements(hardware()["h200"], "default", None, nodes=2, multi_node=True)
    >>> assumed("NVIDIA", offline_env(need, "n1", "10.0.0.11")[1])[0][:37]
    'DMA-BUF GPUDirect RDMA is usable on e'
    >>> assumed("NVIDIA", offline_env(Requirements(hardware()["h200"], "default", None, nodes=1), "n1", "10.0.0.11")[1])
    []
    """
    text = pack_for(brand).transport.gpu_path_assumed
    return [text] if text and any(b.name == PORTS for b in blanks) else []


def secret_token(name: str) -> str:
    """The placeholder a runbook writes for a secret's value (greppable, never a valid value)."""
    return f"@SECRET_{name}@"


def secret_file(config_dir: str, name: str) -> str:
    """Where, on a node, the runbook reads a secret's value from: one file per secret, 0600, written by hand."""
    return f"{config_dir.rstrip('/')}/secrets/{name}"


def without_secrets(env: Mapping[str, str]) -> tuple[str, list[str]]:
    """The env file of the settings ``env`` (a unit's, from its engine spec:
    :attr:`~k3deploy.model.engine.EngineSpec.env_map`) with each secret's value (a setting whose name says it is one:
    :mod:`k3deploy.model.secrets`) replaced by its placeholder, and the secrets' names.

    >>> without_secrets({"A": "1", "DB_PASSWORD": "hunter2"})
    ('A=1\\nDB_PASSWORD=@SECRET_DB_PASSWORD@\\n', ['DB_PASSWORD'])
    """
    names = [name for name in env if is_secret(name)]
    return env_file_text({k: secret_token(k) if k in names else v for k, v in env.items()}), names


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
