"""The console scripts as a user meets them: real processes, real environment, real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def _run(
    command: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("WARM_", "IPAMD_"))}
    full_env.update(env or {})
    return subprocess.run(
        [str(BIN / command), *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_invalid_environment_is_one_error_naming_every_bad_value(tmp_path: Path) -> None:
    result = _run(
        "ipamd",
        "run",
        env={"WARM_IP_TARGET": "-3", "MAX_ENI": "abc", "IPAMD_STATE_DIR": str(tmp_path)},
    )
    assert result.returncode == 2
    assert "WARM_IP_TARGET='-3'" in result.stderr and "MAX_ENI='abc'" in result.stderr
    assert list(tmp_path.iterdir()) == [], "a bad configuration touches nothing"


def test_cni_version_answers_per_spec() -> None:
    result = _run("ipamd-cni", env={"CNI_COMMAND": "VERSION"})
    assert result.returncode == 0
    answer = json.loads(result.stdout)
    assert answer["cniVersion"] == "1.1.0"
    assert {"0.4.0", "1.0.0", "1.1.0"} <= set(answer["supportedVersions"])


def test_cni_unknown_command_is_a_cni_error() -> None:
    result = _run("ipamd-cni", env={"CNI_COMMAND": "EXPLODE"})
    assert result.returncode != 0
    assert json.loads(result.stdout)["code"] == 4
