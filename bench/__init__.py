"""Benchmarks of ipamd's allocation engine on a real, durable state file.

`python -m bench` runs every family and prints one `name: value` line per metric on stdout (progress
goes to stderr). Each family works in its own fresh temporary directory and touches nothing else.
"""
