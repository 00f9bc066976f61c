"""The peers: reference implementations that the benchmarks and the tests compare attnkit with.

Test-and-bench only code; the tests import it as a package (`bench.peers.hf_models`).
"""
