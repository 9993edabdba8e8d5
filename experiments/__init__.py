"""Benchmarks and experiments; they write their numbers to docs/BENCHMARKS.md."""
