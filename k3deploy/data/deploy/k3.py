"""Kimi-K3 on vLLM: from preflight to serving.

    k3deploy deploy inventories/gb300.py -y                # roll out, from any directory (pyinfra runs this file)
    k3deploy deploy inventories/gb300.py --dry --diff      # review first
    k3deploy deploy inventories/gb300.py -y --data k3_rollback=true
    pyinfra inventories/gb300.py deploy/k3.py -y           # the same, from a clone (its deploy/k3.py runs this file)

The selection and every knob come from group_vars/*.yml and the inventory (docs/variables.md).
"""

from k3deploy.runtime.phases import context, preflight_phase, roll_out

run = context()  # lock -> inventory -> plan -> preflight facts and checks -> rendered files -> what restarts

# 1. Preflight on every host: any failure stops here, before anything is changed.
preflight_phase(ctx=run)

if run.ok:
    # 2-6. The rollout, in the order of k3deploy.model.steps.ORDER (the runbook's sections follow the same order):
    #  - stage, on every node in parallel: the image (digest verified when pinned) and the weights, once;
    #  - configure: env files (0600) and systemd units, written beside the live ones (a group whose member failed
    #    the stage gets none); k3_launcher: slurm: env files, launch scripts and, on the submit host, batch scripts;
    #  - start what changed, group by group: stop, record the revision and put its files in place, head, its
    #    rendezvous port, workers, readiness; P/D pools, router; k3_launcher: slurm: cancel the group's job, submit
    #    its new one (the job starts head, then workers), readiness; the lock is given back as the run ends;
    #  - virtual address (k3_vip): keepalived (VRRP) on every host and spare; the host that serves the endpoint
    #    holds the site's virtual address, which is the endpoint;
    #  - smoke test: one short chat completion through the public endpoint.
    roll_out(ctx=run)
