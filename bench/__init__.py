"""Benchmarks for fmail-nm (not part of the test suite); see BENCHMARKS.md."""
