"""memory_store: promoted mechanisms as entries (option delta, requires, contract, evidence), the reproduce
rule checked by hash, and reuse in new deployments (``entry``, ``store``; ``specpilot memory``)."""

from .entry import compose, make_entry, reproduces
from .store import RefusedEntry, Store, default_dir

__all__ = ["RefusedEntry", "Store", "compose", "default_dir", "make_entry", "reproduces"]
