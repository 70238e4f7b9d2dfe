"""A simulated GPU cluster on one Linux host.

Each node is a network namespace on a private bridge, a copy-on-write root (overlayfs over a shared,
cached Debian base root, the upper layer on a per-node tmpfs), a real systemd booted by
``systemd-nspawn --boot`` and a real OpenSSH sshd that accepts the cluster's key for root. The GPU
vendor tools, ``docker`` and the inference engine inside the nodes are simulations
(``k3deploy/sim/node_tools``) driven by ``/etc/k3sim/node.json``.

Modules:

- :mod:`k3deploy.sim.base`: builds and caches the base root (``k3deploy sim base``).
- :mod:`k3deploy.sim.cluster`: brings clusters up and down, status, runtime faults.
- :mod:`k3deploy.cli.sim`: the ``k3deploy sim`` commands.
- :mod:`k3deploy.sim.profiles` / :mod:`k3deploy.sim.faults`: hardware profiles and fault specs.
"""
