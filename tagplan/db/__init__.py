"""Persistence shared by the API and the workers: tables, sessions, blobs, queries.

It sits below both (``service -> workers -> db -> planner``) because workers read their
inputs from the database by job id and must not import the web layer.
"""
