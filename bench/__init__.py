"""Benchmarks, run by hand (never timed assertions in tests). See docs/benchmarks.md."""
