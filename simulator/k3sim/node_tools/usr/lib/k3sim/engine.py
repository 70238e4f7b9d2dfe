#!/usr/bin/python3
"""Simulated vLLM 0.33.0 engine: ``engine.py [serve] MODEL [--flags ...]``; the program is ``vllmsim.py``.

This front stays small because Python compiles a script's own code on every start, and keeps an imported
module's compiled code (a node's boot compiles ``/usr/lib/k3sim``).
"""
import os
import sys

sys.dont_write_bytecode = True  # the tools may live on a read-only tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllmsim  # noqa: E402

sys.exit(vllmsim.main(sys.argv[1:]))
