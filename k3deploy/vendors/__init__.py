"""Vendor packs: everything k3deploy knows about one vendor family, in one place per vendor.

Pure (the packs import nothing above :mod:`k3deploy.recipe`). One package per family, each with a pure
``__init__`` (its :class:`~k3deploy.vendors.base.Pack` and floors) and a ``checks`` module at the preflight layer
(the facts it reads and the judges of its checks):

* :mod:`k3deploy.vendors.nvidia`: HGX (NVSwitch, Fabric Manager) and GB200/GB300 NVL72 trays (IMEX, MNNVL);
* :mod:`k3deploy.vendors.amd`: AMD Instinct (amdgpu, ROCm in the image);
* :mod:`k3deploy.vendors.ascend`: Huawei Ascend A2/A3 (HDK mounts, hccn_tool, HCCL).

The rest of the code finds the pack once and asks it; nothing outside the packs branches on the vendor (a test
keeps it so). Where a vendor's hardware differs (HGX boards vs NVL72 trays, MI300X vs MI355X, A2 vs A3), the
difference is data of its pack or of the hardware profile (``taxonomy.yaml``), not a branch elsewhere.

Adding a vendor family: a package ``vendors/<family>/`` with its ``PACK`` (``__init__.py``), its facts
(``facts.py``) and its ``CHECKS`` (``checks.py``: its facts type on top of :class:`k3deploy.preflight.base.HostFacts`,
the facts it reads, its judges and probes), and its simulated tools (``simulator/k3sim/node_tools``); the packs are
found, not listed (:data:`PACKS`, :data:`k3deploy.preflight.checks.VENDOR_CHECKS`); docs/architecture.md lists the
rest.

    >>> pack_for("NVIDIA").name, pack_for_container("npu").brand, pack_for_container("none")
    ('nvidia', 'Huawei', None)
    >>> pack_for("Intel")
    Traceback (most recent call last):
    ...
    k3deploy.errors.K3Error: k3deploy has no vendor pack for Intel hardware: use NVIDIA, AMD or Huawei hardware
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from k3deploy.errors import K3Error
from k3deploy.vendors.base import Check, Container, Pack, Spot, Transport


def discover() -> tuple[Pack, ...]:
    """The ``PACK`` of every package of this one (a vendor family each), by their ``rank``. A pack's name is its
    package's, where its facts and its preflight side are found."""
    found = []
    for module in pkgutil.iter_modules(__path__):
        pack = getattr(importlib.import_module(f"{__name__}.{module.name}"), "PACK", None) if module.ispkg else None
        if isinstance(pack, Pack):
            if pack.name != module.name:
                raise ImportError(f"the pack of k3deploy/vendors/{module.name} is named {pack.name!r}: name it "
                                  f"{module.name!r}, as its package")
            found.append(pack)
    return tuple(sorted(found, key=lambda pack: (pack.rank, pack.name)))


#: every pack, one per vendor family
PACKS: tuple[Pack, ...] = discover()

__all__ = ["PACKS", "Check", "Container", "Pack", "Spot", "Transport", "pack_for", "pack_for_container"]


def pack_for(what: Any) -> Pack:
    """The pack of a brand (``"NVIDIA"``), a hardware profile (its ``brand``) or anything with a ``hardware``
    (:class:`~k3deploy.model.requirements.Requirements`)."""
    brand = what if isinstance(what, str) else getattr(getattr(what, "hardware", what), "brand", None)
    for pack in PACKS:
        if pack.brand == brand:
            return pack
    raise K3Error(f"k3deploy has no vendor pack for {brand} hardware: use "
                  f"{', '.join(p.brand for p in PACKS[:-1])} or {PACKS[-1].brand} hardware")


def pack_for_container(key: str) -> Pack | None:
    """The pack of a plan's container ``vendor`` (``nvidia``, ``amd``, ``npu``); None for a container of no vendor
    (a router's)."""
    return next((pack for pack in PACKS if pack.container_key == key), None)
