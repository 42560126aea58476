"""Benchmarks. Each script measures one quality bar and rewrites its section of BENCHMARKS.md."""
