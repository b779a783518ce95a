"""glasu service package."""
