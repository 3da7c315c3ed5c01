"""``gateway.caching``'s bounded map and set under their former names, for
``store/tiers_cache.py``; everything else imports ``gateway.caching``."""

from gateway.caching import BoundedMap as Recent
from gateway.caching import BoundedSet as RecentSet

__all__ = ["Recent", "RecentSet"]
