"""Start-up's objects are frozen out of later garbage collections, and still freed when their last
reference goes."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from ipamd.node.compose import freeze_start_up


class _Made:
    """Something start-up made (weak-referenceable, tracked by the collector)."""


@pytest.fixture
def frozen() -> Iterator[None]:
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()  # the rest of the test session collects as it did


def test_what_start_up_made_is_left_out_of_collections(frozen: None) -> None:
    made = [_Made() for _ in range(1000)]
    assert gc.get_freeze_count() == 0
    freeze_start_up()
    assert gc.get_freeze_count() >= len(made)
    walked = {id(o) for o in gc.get_objects()}  # what a full collection would walk now
    assert not any(id(m) in walked for m in made)


def test_a_frozen_object_is_still_freed_by_its_last_reference(frozen: None) -> None:
    made = _Made()
    ref = weakref.ref(made)
    freeze_start_up()
    del made
    assert ref() is None
