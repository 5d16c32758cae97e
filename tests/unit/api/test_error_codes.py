"""Every error the API answers with carries one of `ipamd.wire`'s codes, one code per kind of error,
and the API's table of codes lists them all: the plugin and ipamctl match on exactly these."""

from __future__ import annotations

import ipamd.api.app
import ipamd.api.errors
import ipamd.runtime.ports
from ipamd import wire
from ipamd.errors import IpamdError

WIRE_CODES = {value for name, value in vars(wire).items() if name.startswith("CODE_")}


def _kinds(cls: type[IpamdError]) -> set[type[IpamdError]]:
    found = {cls}
    for sub in cls.__subclasses__():
        found |= _kinds(sub)
    return found


def test_every_ipamd_error_answers_with_a_code_of_the_wire() -> None:
    kinds = _kinds(IpamdError)
    assert ipamd.runtime.ports.RuntimeUnavailable in kinds, "the runtime's error is an ipamd error"
    assert ipamd.api.errors.NotReady in kinds
    assert {k.code for k in kinds} <= WIRE_CODES
    codes = [k.code for k in kinds]
    assert len(codes) == len(set(codes)), "one kind of error per code"


def test_the_api_documents_every_code_of_the_wire() -> None:
    table = ipamd.api.app.__doc__ or ""
    missing = {code for code in WIRE_CODES if f"`{code}`" not in table}
    assert not missing, f"codes the API's table does not list: {missing}"


def test_runtime_unavailable_is_answered_503_and_retryable() -> None:
    err = ipamd.runtime.ports.RuntimeUnavailable("CRI ListPodSandbox: connection refused")
    assert (err.status, err.code, err.retryable) == (503, wire.CODE_RUNTIME_UNAVAILABLE, True)
