"""Peer implementations the benchmarks compare against (test-and-bench only code)."""
