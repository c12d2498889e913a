"""tlv: two-level verification (SpecPilot's third round), the round logic as a library.

A cheap Q pass (the target on W12's 8-bit view) drafts a greedy chain and accepts nothing; the drafter
drafts again from the chain's end; one exact pass verifies both as one tree: the Q chain is a trunk, the
drafter's tree hangs from its end, and an optional tree of the drafter's own from the root. This package
holds the pieces that need no model: the plan (budget split, depth, reach), the combined tree's node /
parent layout, the drafter's feature window for an EAGLE-3 drafter, and per-round statistics. Pure
torch, tensor ops only (capturable), no engine import; each piece has a plain reference beside it.
"""

from tlv.combine import combine_tree, combine_tree_reference
from tlv.plan import TLVPlan
from tlv.stats import trunk_accepted, trunk_accepted_reference
from tlv.window import chain_window, chain_window_reference

__all__ = [
    "TLVPlan",
    "chain_window",
    "chain_window_reference",
    "combine_tree",
    "combine_tree_reference",
    "trunk_accepted",
    "trunk_accepted_reference",
]
