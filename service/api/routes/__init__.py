"""Routers: admin sessions, client rounds, health and metrics."""
