"""REST service: API, persistence, auth (docs/design.md §9)."""
