"""Triton kernels, each with a launcher and a plain PyTorch reference (see STYLE.md)."""

from .gdn_tree_wy import gdn_tree_wy, gdn_tree_wy_ref
from .gemv import gemv, gemv_ref
from .tree_attention import tree_attention, tree_attention_ref

__all__ = ["gdn_tree_wy", "gdn_tree_wy_ref", "gemv", "gemv_ref", "tree_attention", "tree_attention_ref"]
