"""w12: filled by a later issue (see ../shared/DESIGN.md)."""
