"""Kimi-K3 on vLLM: from preflight to serving, from a clone's top directory (``config.py`` is loaded first).

    pyinfra inventories/gb300.py deploy/k3.py -y          # roll out
    pyinfra inventories/gb300.py deploy/k3.py --dry --diff # review first
    pyinfra inventories/gb300.py deploy/k3.py -y --data k3_rollback=true
    k3deploy deploy inventories/gb300.py -y               # the same, from any directory

The deploy is the package's file, ``k3deploy/data/deploy/k3.py`` (what ``k3deploy deploy`` runs): this one runs it.
The selection and every knob come from group_vars/*.yml and the inventory (docs/variables.md).
"""

from k3deploy.runtime.command import DEPLOY

exec(compile(DEPLOY.read_text(), str(DEPLOY), "exec"))
