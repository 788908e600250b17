"""The benchmark harness (common.py) and the benchmarks; run them as scripts: python benchmarks/bench_X.py."""
