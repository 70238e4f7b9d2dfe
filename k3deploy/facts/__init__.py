"""pyinfra facts about GPU nodes, read before anything is changed (see ``k3deploy preflight``).

Every fact returns a typed value or a :class:`k3deploy.facts.base.FactError` (tool absent, tool
failed, output unparsable); none of them fails the host or raises.
"""

from k3deploy.facts.base import FactError

__all__ = ["FactError"]
