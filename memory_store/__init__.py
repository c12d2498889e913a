"""memory_store: filled by a later issue (see ../shared/DESIGN.md)."""
