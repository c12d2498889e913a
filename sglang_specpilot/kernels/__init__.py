"""Triton kernels, each with a launcher and a plain PyTorch reference (see STYLE.md)."""

from .tree_attention import tree_attention, tree_attention_ref

__all__ = ["tree_attention", "tree_attention_ref"]
