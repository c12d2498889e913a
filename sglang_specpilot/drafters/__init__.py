"""Trained draft models that share the target's embedding and LM head (only their own layers are stored)."""

from .shared_head import (
    DEFAULT_SMOLLM2_DRAFTER,
    default_drafter_path,
    init_shared_drafter,
    is_shared_drafter,
    load_shared_drafter,
    save_shared_drafter,
)

__all__ = [
    "DEFAULT_SMOLLM2_DRAFTER",
    "default_drafter_path",
    "init_shared_drafter",
    "is_shared_drafter",
    "load_shared_drafter",
    "save_shared_drafter",
]
