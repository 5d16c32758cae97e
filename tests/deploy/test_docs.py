"""docs/operations.md keeps up with the code: every metric ipamd publishes is in its table, it links
the generated settings table instead of copying it, and it has a runbook for each seed incident."""

from __future__ import annotations

import re

from tests.deploy.repo import REPO

OPERATIONS = REPO / "docs" / "operations.md"


def published_metrics() -> set[str]:
    """Every name with a `# TYPE` line in ipamd/metrics.py: each metric it renders has one."""
    source = (REPO / "ipamd" / "metrics.py").read_text()
    return set(re.findall(r"# TYPE ((?:awscni|ipamd)_\w+) ", source))


def table_metrics() -> set[str]:
    text = OPERATIONS.read_text()
    return set(re.findall(r"^\| `((?:awscni|ipamd)_[a-z0-9_]+)` \|", text, flags=re.MULTILINE))


def test_every_published_metric_is_in_the_table() -> None:
    published = published_metrics()
    assert "awscni_assigned_ip_addresses" in published and "ipamd_add_latency_seconds" in published
    assert published == table_metrics(), {
        "undocumented": sorted(published - table_metrics()),
        "not published": sorted(table_metrics() - published),
    }


def test_links_the_settings_table_instead_of_copying_it() -> None:
    text = OPERATIONS.read_text()
    assert "](configuration.md)" in text
    assert "<!-- settings:begin -->" not in text
    assert "| `IPAMD_EC2_CALL_TIMEOUT` |" not in text


def test_a_runbook_for_each_seed_incident() -> None:
    text = OPERATIONS.read_text()
    runbooks = text.split("## Runbooks", 1)[1]
    for seed in ("seed 000", "seed 001", "seed 002", "seed 003"):
        assert seed in runbooks, seed
    assert runbooks.count("ipamctl repair") >= 4
