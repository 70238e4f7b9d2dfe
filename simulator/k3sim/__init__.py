"""A simulated GPU cluster on one Linux host.

Each node is a network namespace on a private bridge, a copy-on-write root (overlayfs over a shared,
cached Debian base root, the upper layer on a per-node tmpfs), a real systemd booted by
``systemd-nspawn --boot`` and a real OpenSSH sshd that accepts the cluster's key for root. The GPU
vendor tools, ``docker`` and the inference engine inside the nodes are simulations
(``simulator/k3sim/node_tools``) driven by ``/etc/k3sim/node.json``. Beyond the nodes, one simulated outside (the
container registries and the model hub, behind a shaped uplink) serves real bytes and counts them.

A package of its own (``simulator/pyproject.toml``), outside k3deploy's wheel: it uses k3deploy (the recipe, the
vendor packs, the facts' commands), k3deploy never imports it, and its ``k3deploy sim`` commands reach the command
line through the entry point group ``k3deploy.commands``.

Modules:

- :mod:`k3sim.cluster`: the lifecycle and the public API: brings clusters up and down, status,
  runtime faults; composes the modules below (and re-exports the names other code uses).
- :mod:`k3sim.state`: cluster names, node layout, ``state.json`` files, the host-wide lock.
- :mod:`k3sim.processes`: the nodes' ``systemd-nspawn``, PIDs and cgroups (start, stop by PID).
- :mod:`k3sim.network`: bridge, subnets, network namespaces and veth pairs, tc shaping (uplink, node links).
- :mod:`k3sim.outside`: the simulated outside's HTTP server (OCI registry and Hugging Face hub API, byte
  counters, the ``outside-cut`` fault), run as a script in the namespace ``NAME-out``; its pure size helpers.
- :mod:`k3sim.rootfs`: node tmpfs, overlay root, per-node files and tools, the "disks", unmounting.
- :mod:`k3sim.inventory`: the pyinfra inventory and ``group_vars`` of a cluster.
- :mod:`k3sim.host`: :class:`~k3sim.host.SimError`, running host commands, atomic writes.
- :mod:`k3sim.base`: builds and caches the base root (``k3deploy sim base``).
- :mod:`k3sim.slurm`: a real Slurm in a cluster (``sim up --slurm``): slurm.conf, gres.conf, the munge key,
  the units per node, sinfo/squeue read on the controller.
- :mod:`k3sim.profiles` / :mod:`k3sim.faults`: hardware profiles and fault specs (node faults
  ``RANK:KIND[=VALUE]``, cluster faults ``KIND=VALUE``).
- :mod:`k3sim.cli`: the ``k3deploy sim`` commands.
"""
