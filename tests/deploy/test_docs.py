"""docs/operations.md keeps up with the code: every metric ipamd publishes is in its table, with its
type and labels; it links the generated settings table instead of copying it, it has a runbook for
each seed incident, and its ENIConfig files are files ipamd reads."""

from __future__ import annotations

import re

from ipamd.config.eniconfig import EniConfig, parse_eni_configs
from ipamd.telemetry.catalogue import CATALOGUE
from tests.deploy.repo import REPO

OPERATIONS = REPO / "docs" / "operations.md"


def published_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every metric ipamd publishes (its catalogue): name → (type, labels)."""
    return {spec.name: (spec.type, spec.labels) for spec in CATALOGUE}


def table_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """The metrics table of docs/operations.md: name → (type, labels)."""
    text = OPERATIONS.read_text()
    rows = re.findall(
        r"^\| `((?:awscni|ipamd)_[a-z0-9_]+)` \| (\w+) \|([^|]*)\|", text, flags=re.MULTILINE
    )
    return {name: (kind, tuple(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows}


def test_every_published_metric_is_in_the_table_with_its_type_and_labels() -> None:
    published = published_metrics()
    assert "awscni_assigned_ip_addresses" in published and "ipamd_add_latency_seconds" in published
    documented = table_metrics()
    assert set(published) == set(documented), {
        "undocumented": sorted(set(published) - set(documented)),
        "not published": sorted(set(documented) - set(published)),
    }
    assert published == documented


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


def test_the_eniconfig_files_of_custom_networking_are_read_as_shown() -> None:
    section = OPERATIONS.read_text().split("## Custom networking", 1)[1].split("\n## ", 1)[0]
    files = re.findall(r"^```json\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)
    assert len(files) == 2, "the kubectl list and the map of zone to spec"
    expected = (
        EniConfig("us-west-2a", "subnet-0a1b2c3d4e5f60718", ("sg-0123456789abcdef0",)),
        EniConfig("us-west-2b", "subnet-1b2c3d4e5f6071829"),
    )
    for text in files:
        assert parse_eni_configs(text) == expected
