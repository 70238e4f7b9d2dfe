"""pyinfra runs this file before it loads the inventory and connects to any host (``k3deploy deploy INVENTORY`` runs
it from anywhere; ``pyinfra INVENTORY deploy/k3.py`` in a clone's top directory runs its ``config.py``, which runs
this one): each host gets the connection settings (``ssh_user``, ``ssh_key``, ...) of the group_vars files that
apply to it, wherever the inventory lives (see :func:`k3deploy.runtime.connections.give_pyinfra_group_vars`), the
deploy's SSH connections offer AES-GCM first (see :func:`k3deploy.runtime.connections.prefer_aead_ciphers`), and an
interruption from here on ends the run with a
non-zero exit saying what it left (:mod:`k3deploy.runtime.interrupts`)."""

from k3deploy.runtime.connections import give_pyinfra_group_vars, prefer_aead_ciphers
from k3deploy.runtime.interrupts import before_connecting

give_pyinfra_group_vars()
prefer_aead_ciphers()
before_connecting()
