"""``python -m k3deploy.cli``: the ``k3deploy`` command with a chosen interpreter (the watch loop's systemd unit runs
it so, from the checkout whose ``deploy/k3.py`` its repairs run)."""

from k3deploy.cli import main

if __name__ == "__main__":
    main()
