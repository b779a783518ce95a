"""glasu secure package."""
