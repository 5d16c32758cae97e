"""`python -m bench.kube_clients`: each figure comes from a fresh process that imported the client,
and a client the interpreter cannot import is reported missing, never given a figure."""

from __future__ import annotations

import sys

from bench.kube_clients import CANDIDATES, measure


def test_ipamds_own_client_is_measured_in_a_fresh_process() -> None:
    figures = measure(sys.executable, CANDIDATES["ipamd_aiohttp"], runs=1)
    assert figures is not None
    import_ms, rss_mib = figures
    assert import_ms > 0
    assert rss_mib >= 0


def test_a_client_that_cannot_be_imported_has_no_figure() -> None:
    assert measure(sys.executable, "import no_such_kubernetes_client", runs=1) is None
