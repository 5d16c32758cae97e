"""`make report`: docs/benchmarks.md and its plots from one run of every benchmark."""
