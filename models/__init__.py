"""glasu models package."""
