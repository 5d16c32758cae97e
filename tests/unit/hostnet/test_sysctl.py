"""The reverse-path filter as the kernel applies it: the higher of `all` and the link's value."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipamd.hostnet.ports import HostNetError
from ipamd.hostnet.sysctl import LOOSE, STRICT, read_rp_filter


def _conf(root: Path, all_value: str, eth0: str) -> Path:
    for name, value in (("all", all_value), ("eth0", eth0)):
        (root / name).mkdir()
        (root / name / "rp_filter").write_text(f"{value}\n")
    return root


@pytest.mark.parametrize(
    ("all_value", "eth0", "applied"),
    [("0", "2", LOOSE), ("1", "2", LOOSE), ("1", "0", STRICT), ("0", "1", STRICT), ("0", "0", 0)],
)
def test_the_higher_of_all_and_the_link_applies(
    tmp_path: Path, all_value: str, eth0: str, applied: int
) -> None:
    assert read_rp_filter("eth0", _conf(tmp_path, all_value, eth0)) == applied


def test_an_unknown_link_or_a_bad_name_is_an_error(tmp_path: Path) -> None:
    conf = _conf(tmp_path, "0", "2")
    with pytest.raises(HostNetError, match="eth9"):
        read_rp_filter("eth9", conf)
    with pytest.raises(HostNetError, match="not a link name"):
        read_rp_filter("../all", conf)
