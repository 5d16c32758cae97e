"""aws-node's conflist leaves the conf dir once ipamd's own is written, and nothing else does."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ipamd.node import conflist

AWS = b'{"name": "aws-cni", "plugins": [{"type": "aws-cni"}]}\n'


def test_aws_nodes_conflist_goes_once_ipamds_is_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "10-aws.conflist").write_bytes(AWS)
    (tmp_path / "99-other.conflist").write_bytes(b"{}")
    own = conflist.write(tmp_path, "10-ipamd.conflist", b'{"name": "aws-cni"}\n')

    with caplog.at_level(logging.INFO):
        assert conflist.remove_aws_node(own) == tmp_path / "10-aws.conflist"

    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "10-ipamd.conflist",
        "99-other.conflist",
    ]
    assert "cni.aws_node_conflist_removed" in caplog.text
    assert '"type": "aws-cni"' in caplog.text, "its contents are in the log, not in a copy"
    assert conflist.remove_aws_node(own) is None, "again: nothing to do"


def test_ipamds_own_file_of_that_name_stays(tmp_path: Path) -> None:
    own = conflist.write(tmp_path, "10-aws.conflist", b"{}\n")
    assert conflist.remove_aws_node(own) is None
    assert own.read_bytes() == b"{}\n"
