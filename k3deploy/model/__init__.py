"""The cluster layer (pure: never pyinfra or gevent; the callers read the hosts).

inventory host records + group_vars -> :mod:`variables` -> plan (:mod:`k3deploy.recipe`) -> :mod:`binding`
(placeholders filled per host) -> :mod:`units` (container command, env file, systemd unit) ->
:mod:`rollout` (per host the files and units, the start order, what restarts) -> :mod:`diff` (what would
change) and :mod:`runbook` (the same rollout as commands for people). :mod:`commands` holds every shell
command the rollout runs, for the operations and the runbook alike; :mod:`pipeline` ties the steps together.
"""
