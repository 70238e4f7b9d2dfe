"""pyinfra runs this file from the working directory before it connects to any host (``pyinfra INVENTORY
deploy/k3.py``, run from here): the deploy's SSH connections offer AES-GCM first (see
:func:`k3deploy.runtime.connections.prefer_aead_ciphers`), and an interruption from here on ends the run with a
non-zero exit saying what it left (:mod:`k3deploy.runtime.interrupts`)."""

from k3deploy.runtime.connections import prefer_aead_ciphers
from k3deploy.runtime.interrupts import before_connecting

prefer_aead_ciphers()
before_connecting()
