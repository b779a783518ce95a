"""glasu clients package."""
