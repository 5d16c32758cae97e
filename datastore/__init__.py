"""Durable node state for ipamd: the SQLite schema, its migrations, transactions and integrity.

This package knows durability and nothing else: no AWS, no HTTP, no pods beyond the records it stores.
"""
