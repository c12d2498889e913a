"""tlv: filled by a later issue (see ../shared/DESIGN.md)."""
