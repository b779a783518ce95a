"""HTTP layer: dependencies and routers."""
