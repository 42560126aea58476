"""REST service: API, persistence, auth (DESIGN.md §9)."""
