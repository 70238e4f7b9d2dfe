"""pyinfra reads ``group_data/*.py`` only: this bridge hands it the connection settings (``ssh_*``, ``_sudo``, ...)
of ``group_vars/all.yml``, so ``pyinfra inventories/x.py deploy/k3.py`` connects as k3deploy's own commands do."""

from k3deploy.model.variables import connector_settings as _connector_settings

globals().update(_connector_settings(__file__, "all"))
