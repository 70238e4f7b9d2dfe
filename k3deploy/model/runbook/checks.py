"""The command a person runs to see what each preflight check reads: from the check registry of the vendor pack
(:meth:`k3deploy.vendors.base.Pack.check`), the one place a check's command, requirement and fix are written."""

from __future__ import annotations

from k3deploy.model.commands import PEERS_UNIT
from k3deploy.model.rollout import Rollout
from k3deploy.recipe.taxonomy import hardware
from k3deploy.vendors import Pack, Spot


def spot_for(rollout: Rollout, address: str) -> Spot:
    """What a check's command needs of the node at ``address`` in this rollout."""
    profile = hardware().get(rollout.plan.hardware)
    return Spot(address=address, cache=rollout.vars.k3_model_cache, router_bin=rollout.vars.k3_router_bin,
                image=rollout.plan.image,
                devices=int(profile.gpu_count) if profile is not None else 8, peers_unit=PEERS_UNIT,
                config_dir=rollout.vars.k3_config_dir)


def check_command(pack: Pack, check: str, spot: Spot) -> str:
    """The command of a registered check (a check the registry does not know has none: "")."""
    try:
        return pack.check(check).command_for(spot)
    except KeyError:
        return ""


def node_commands(pack: Pack, checks: list[str], spot: Spot) -> list[str]:
    """The commands of these checks that a person runs on the node itself, each once, in order."""
    out: list[str] = []
    for name in checks:
        try:
            spec = pack.check(name)
        except KeyError:
            continue
        command = spec.command_for(spot)
        if spec.where == "node" and command and command not in out:
            out.append(command)
    return out
