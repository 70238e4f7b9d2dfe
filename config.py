"""pyinfra runs this file from the working directory before it loads the inventory and connects to any host
(``pyinfra INVENTORY deploy/k3.py``, run from here): it runs the deploy's configuration, the package's
``k3deploy/data/deploy/config.py`` (what ``k3deploy deploy INVENTORY`` loads from anywhere)."""

from k3deploy.runtime.command import CONFIG

exec(compile(CONFIG.read_text(), str(CONFIG), "exec"))
