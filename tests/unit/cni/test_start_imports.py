"""What the plugin's start imports, in a clean interpreter (isolated, no `site`): nothing that
`build_cni_bundle.HEAVY_MODULES` names and no more modules than `START_IMPORTS_BUDGET`. Every pod's
ADD and DEL starts the plugin, so a regrown import closure is a regression of pod start-up; the
timings themselves are the benchmark's (`bench/plugin.py`), not a test's."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "deploy" / "image" / "build_cni_bundle.py"


@pytest.fixture(scope="module")
def bundle_builder() -> ModuleType:
    """`deploy/image/build_cni_bundle.py`, a script rather than a package module, loaded by path."""
    spec = importlib.util.spec_from_file_location("build_cni_bundle", BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_plugins_start_imports_nothing_heavy_and_stays_in_its_budget(
    bundle_builder: ModuleType,
) -> None:
    modules: list[str] = bundle_builder.local_imports()
    assert "ipamd.cni.plugin" in modules and "ipamd.wire" in modules, "the probe saw the import"
    assert bundle_builder.heavy_imports(modules) == []
    budget: int = bundle_builder.START_IMPORTS_BUDGET
    assert len(modules) <= budget, f"{len(modules)} modules over the budget of {budget}: {modules}"


def test_the_heavy_list_names_what_the_plugin_replaced_and_the_daemons_stack(
    bundle_builder: ModuleType,
) -> None:
    heavy = set(bundle_builder.HEAVY_MODULES)
    assert {"http", "email", "ssl", "dataclasses", "asyncio", "typing_extensions"} <= heavy
    assert {"re", "json", "socket", "enum", "typing", "aiohttp", "ipamd.engine"} <= heavy


def test_a_submodule_of_a_heavy_module_is_heavy(bundle_builder: ModuleType) -> None:
    found = bundle_builder.heavy_imports(["json.decoder", "jsonish", "email", "ipamd.wire"])
    assert found == ["json.decoder", "email"]


def test_the_check_refuses_a_start_over_budget_or_with_a_heavy_module(
    bundle_builder: ModuleType,
) -> None:
    budget: int = bundle_builder.START_IMPORTS_BUDGET
    with pytest.raises(bundle_builder.BundleError, match="budget"):
        bundle_builder.check_start([f"m{n}" for n in range(budget + 1)])
    with pytest.raises(bundle_builder.BundleError, match=r"re\._parser"):
        bundle_builder.check_start(["ipamd.wire", "re._parser"])
    bundle_builder.check_start([f"m{n}" for n in range(budget)])
