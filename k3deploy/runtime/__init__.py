"""The pyinfra runtime: reading the hosts (:mod:`gather`, with :mod:`views`, :mod:`connections` and
:mod:`reading`), the operations (:mod:`operations`), the readiness gates (:mod:`readiness`), the phases of
``deploy/k3.py`` (:mod:`phases`), the deployment lock (:mod:`lock`) and all that touches pyinfra's
internals, for the one pyinfra version it was written for (:mod:`pyinfra_internals`)."""
