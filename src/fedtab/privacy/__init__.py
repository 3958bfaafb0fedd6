"""Privacy of what a site sends: its disclosure policy, secure aggregation, differential privacy.

* :mod:`.policy` — the site-owned :class:`DisclosurePolicy` checked before every handler.
"""

from .policy import OTHER_CATEGORY, DisclosurePolicy, policy_from_config

__all__ = ["DisclosurePolicy", "OTHER_CATEGORY", "policy_from_config"]
