"""The pyinfra runtime: reading the hosts (:mod:`gather`), the operations (:mod:`operations`), the readiness
gates (:mod:`readiness`), the phases of ``deploy/k3.py`` (:mod:`phases`) and a cheaper naming of operation calls
for pyinfra (:mod:`oporder`)."""
