"""Routers of the REST API."""
