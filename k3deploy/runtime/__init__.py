"""The pyinfra runtime: reading the hosts (:mod:`gather`), the operations (:mod:`operations`), the readiness
gates (:mod:`readiness`) and the phases of ``deploy/k3.py`` (:mod:`phases`)."""
