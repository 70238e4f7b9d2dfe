"""End-to-end tests: deploys over real SSH to simulated clusters (fixtures: conftest.py)."""
