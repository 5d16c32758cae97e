"""The IAM policy grants exactly the EC2 actions the adapter can call, and nothing more.

The adapter's operations are read from `cloud/ec2.py`'s syntax tree: every operation name handed to
`self._call` / `self._describe_all` (a string literal, or a local bound to one) and every method
called directly on the boto3 client (`self._client.describe_subnets` → `DescribeSubnets`). Each is
checked against botocore's EC2 model, so a typo cannot pass. Tagging on create (`TagSpecifications`
in a `Create*` call) makes EC2 authorize `ec2:CreateTags` as well: that one extra action is granted,
and only with `ec2:CreateAction` naming those creates.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import botocore.session
import pytest

from cloud.ports import MANAGED_BY, TAG_INSTANCE_ID, TAG_MANAGED_BY
from tests.deploy.repo import REPO, Doc, iam_policy

ADAPTER = REPO / "cloud" / "ec2.py"
FORWARDERS = frozenset({"_call", "_describe_all"})
"""The adapter's methods that take an EC2 operation name as their first argument."""
ADDRESS_ACTIONS = frozenset(
    {"ec2:AssignIpv6Addresses", "ec2:AssignPrivateIpAddresses", "ec2:UnassignPrivateIpAddresses"}
)
"""Mutations left without a tag condition: ipamd assigns and unassigns addresses on the primary ENI
too (its IPv6 /80 goes there alone), which EC2 created with the instance, without ipamd's tags."""
ENI_ARN = "arn:aws:ec2:*:*:network-interface/*"


@dataclass
class AdapterOperations:
    operations: set[str] = field(default_factory=set)
    mutating: set[str] = field(default_factory=set)
    tagged_creates: set[str] = field(default_factory=set)
    unresolved: list[str] = field(default_factory=list)


def pascal(snake: str) -> str:
    return "".join(part.capitalize() for part in snake.split("_"))


def _is_self_attr(node: ast.expr, name: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == name
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _string_locals(function: ast.AST) -> dict[str, str]:
    bound: dict[str, str] = {}
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            bound[node.targets[0].id] = node.value.value
    return bound


def _sets_tag_specifications(function: ast.AST) -> bool:
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and node.slice.value == "TagSpecifications"
        ):
            return True
        if isinstance(node, ast.Dict) and any(
            isinstance(k, ast.Constant) and k.value == "TagSpecifications" for k in node.keys
        ):
            return True
    return False


def _operation_of(call: ast.Call, function_name: str, strings: dict[str, str]) -> str | None:
    """The EC2 operation a call invokes, "" when it forwards its own parameter, None for others."""
    target = call.func
    if not isinstance(target, ast.Attribute):
        return None
    if _is_self_attr(target, target.attr) and target.attr in FORWARDERS and call.args:
        first = call.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
        if isinstance(first, ast.Name) and first.id in strings:
            return strings[first.id]
        if function_name in FORWARDERS and isinstance(first, ast.Name):
            return ""  # a forwarder passing on its own `operation` parameter
        return f"?{ast.unparse(first)}"
    if _is_self_attr(target.value, "_client") or (
        isinstance(target.value, ast.Name) and target.value.id == "client"
    ):
        return pascal(target.attr)
    return None


def adapter_operations(source: Path = ADAPTER) -> AdapterOperations:
    found = AdapterOperations()
    tree = ast.parse(source.read_text())
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        strings = _string_locals(function)
        here: set[str] = set()
        for call in ast.walk(function):
            if not isinstance(call, ast.Call):
                continue
            operation = _operation_of(call, function.name, strings)
            if not operation:
                continue
            if operation.startswith("?"):
                found.unresolved.append(f"{function.name}: {operation[1:]}")
                continue
            here.add(operation)
            if any(k.arg == "mutating" and ast.literal_eval(k.value) for k in call.keywords):
                found.mutating.add(operation)
        found.operations |= here
        if _sets_tag_specifications(function):
            found.tagged_creates |= {op for op in here if op.startswith("Create")}
    return found


@pytest.fixture(scope="module")
def adapter() -> AdapterOperations:
    return adapter_operations()


def statements() -> list[Doc]:
    stated: Any = iam_policy()["Statement"]
    return list(stated) if isinstance(stated, list) else [stated]


def as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def granted_actions() -> set[str]:
    return {a for s in statements() for a in as_list(s["Action"])}


def test_the_adapter_is_read_completely(adapter: AdapterOperations) -> None:
    assert adapter.unresolved == [], "an operation name the test cannot read statically"
    assert "DescribeNetworkInterfaces" in adapter.operations, "the scan finds the adapter's calls"
    assert adapter.tagged_creates == {"CreateNetworkInterface"}


def test_every_operation_is_a_real_ec2_operation(adapter: AdapterOperations) -> None:
    model = botocore.session.get_session().get_service_model("ec2")
    assert adapter.operations <= set(model.operation_names), adapter.operations - set(
        model.operation_names
    )


def test_only_the_adapter_imports_boto3() -> None:
    """So reading `cloud/ec2.py` finds every EC2 call the daemon can make (the embedded cloud is
    moto's side, not the daemon's)."""
    importers = set()
    for package in ("ipamd", "cloud", "datastore"):
        for path in (REPO / package).rglob("*.py"):
            if "embedded" in path.relative_to(REPO).parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                if any(n.split(".")[0] in ("boto3", "botocore") for n in names):
                    importers.add(path.relative_to(REPO).as_posix())
    assert importers == {"cloud/ec2.py"}


def test_policy_grants_exactly_the_adapters_actions(adapter: AdapterOperations) -> None:
    expected = {f"ec2:{op}" for op in adapter.operations}
    expected |= {"ec2:CreateTags"} if adapter.tagged_creates else set()
    assert granted_actions() == expected, {
        "missing": sorted(expected - granted_actions()),
        "extra": sorted(granted_actions() - expected),
    }


def test_statements_are_plain_allows_of_named_actions() -> None:
    assert iam_policy()["Version"] == "2012-10-17"
    for s in statements():
        assert s["Effect"] == "Allow"
        assert set(s) <= {"Sid", "Effect", "Action", "Resource", "Condition"}, s.get("Sid")
        for action in as_list(s["Action"]):
            assert action.startswith("ec2:") and not set(action) & set("*?"), action


def test_create_tags_only_when_creating(adapter: AdapterOperations) -> None:
    tagging = [s for s in statements() if "ec2:CreateTags" in as_list(s["Action"])]
    assert tagging
    for s in tagging:
        assert as_list(s["Action"]) == ["ec2:CreateTags"]
        assert set(s["Condition"]) == {"StringEquals"}
        actions = set(as_list(s["Condition"]["StringEquals"]["ec2:CreateAction"]))
        assert actions and actions <= adapter.tagged_creates


def test_mutations_name_resource_types(adapter: AdapterOperations) -> None:
    """EC2's Describe calls support no resource-level permission, so they get "*"; every mutation
    names the resource types it acts on."""
    mutating = {f"ec2:{op}" for op in adapter.mutating} | {"ec2:CreateTags"}
    assert all(not op.startswith("Describe") for op in adapter.mutating)
    for s in statements():
        resources = as_list(s["Resource"])
        if set(as_list(s["Action"])) & mutating:
            assert "*" not in resources, s.get("Sid")
            assert all(r.startswith("arn:aws:ec2:*:*:") and r.endswith("/*") for r in resources)
        else:
            assert all(a.startswith("ec2:Describe") for a in as_list(s["Action"])), s.get("Sid")


def test_eni_mutations_are_limited_by_ipamds_tags(adapter: AdapterOperations) -> None:
    """Creating an ENI requires ipamd's tags on it; attaching, detaching, deleting and modifying one
    require the instance tag ipamd (and VPC CNI) put on the ENIs they create."""
    resource_tag = f"aws:ResourceTag/{TAG_INSTANCE_ID}"
    for s in statements():
        if ENI_ARN not in as_list(s["Resource"]):
            continue
        actions = set(as_list(s["Action"]))
        condition = s.get("Condition", {})
        if actions == {"ec2:CreateNetworkInterface"}:
            assert condition["StringEquals"] == {f"aws:RequestTag/{TAG_MANAGED_BY}": MANAGED_BY}
            assert condition["Null"] == {f"aws:RequestTag/{TAG_INSTANCE_ID}": "false"}
        elif actions == {"ec2:CreateTags"}:
            continue  # checked above: only on create
        elif actions <= ADDRESS_ACTIONS:
            assert not condition
        else:
            assert condition == {"Null": {resource_tag: "false"}}, s.get("Sid")
    eni_lifecycle = {f"ec2:{op}" for op in adapter.mutating} - ADDRESS_ACTIONS
    eni_lifecycle -= {"ec2:CreateNetworkInterface"}
    conditioned = {
        a
        for s in statements()
        if s.get("Condition") == {"Null": {resource_tag: "false"}}
        for a in as_list(s["Action"])
    }
    assert eni_lifecycle <= conditioned, eni_lifecycle - conditioned


def test_the_scan_catches_an_operation_added_to_the_adapter(tmp_path: Path) -> None:
    """A new call, direct or through `_call`, shows up as an action the policy lacks."""
    source = ADAPTER.read_text() + (
        "\n\nclass Extra:\n"
        "    async def release(self) -> None:\n"
        '        operation = "ReleaseAddress"\n'
        "        await self._call(operation, {}, mutating=True)\n"
        "        self._client.disassociate_address()\n"
    )
    patched = tmp_path / "ec2.py"
    patched.write_text(source)
    found = adapter_operations(patched)
    assert {"ReleaseAddress", "DisassociateAddress"} <= found.operations
    assert not {"ec2:ReleaseAddress", "ec2:DisassociateAddress"} <= granted_actions()
