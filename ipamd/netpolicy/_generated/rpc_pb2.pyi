# Generated from ipamd/netpolicy/proto/rpc.proto by generate.sh (grpcio-tools 1.85.1, libprotoc 35.1). Do not edit.
# ruff: noqa
# fmt: off
# mypy: ignore-errors
from google.protobuf import empty_pb2 as _empty_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class EnforceNpRequest(_message.Message):
    __slots__ = ("K8S_POD_NAME", "K8S_POD_NAMESPACE", "NETWORK_POLICY_MODE", "InterfaceCount")
    K8S_POD_NAME_FIELD_NUMBER: _ClassVar[int]
    K8S_POD_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NETWORK_POLICY_MODE_FIELD_NUMBER: _ClassVar[int]
    INTERFACECOUNT_FIELD_NUMBER: _ClassVar[int]
    K8S_POD_NAME: str
    K8S_POD_NAMESPACE: str
    NETWORK_POLICY_MODE: str
    InterfaceCount: int
    def __init__(self, K8S_POD_NAME: _Optional[str] = ..., K8S_POD_NAMESPACE: _Optional[str] = ..., NETWORK_POLICY_MODE: _Optional[str] = ..., InterfaceCount: _Optional[int] = ...) -> None: ...

class EnforceNpReply(_message.Message):
    __slots__ = ("Success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    Success: bool
    def __init__(self, Success: _Optional[bool] = ...) -> None: ...

class DeleteNpRequest(_message.Message):
    __slots__ = ("K8S_POD_NAME", "K8S_POD_NAMESPACE")
    K8S_POD_NAME_FIELD_NUMBER: _ClassVar[int]
    K8S_POD_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    K8S_POD_NAME: str
    K8S_POD_NAMESPACE: str
    def __init__(self, K8S_POD_NAME: _Optional[str] = ..., K8S_POD_NAMESPACE: _Optional[str] = ...) -> None: ...

class DeleteNpReply(_message.Message):
    __slots__ = ("Success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    Success: bool
    def __init__(self, Success: _Optional[bool] = ...) -> None: ...

class NetworkPolicyAgentConfigReply(_message.Message):
    __slots__ = ("NetworkPolicyMode", "MultiNICEnabled", "NodeIPv4", "NodeIPv6", "InstanceID", "Region")
    NETWORKPOLICYMODE_FIELD_NUMBER: _ClassVar[int]
    MULTINICENABLED_FIELD_NUMBER: _ClassVar[int]
    NODEIPV4_FIELD_NUMBER: _ClassVar[int]
    NODEIPV6_FIELD_NUMBER: _ClassVar[int]
    INSTANCEID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    NetworkPolicyMode: str
    MultiNICEnabled: bool
    NodeIPv4: str
    NodeIPv6: str
    InstanceID: str
    Region: str
    def __init__(self, NetworkPolicyMode: _Optional[str] = ..., MultiNICEnabled: _Optional[bool] = ..., NodeIPv4: _Optional[str] = ..., NodeIPv6: _Optional[str] = ..., InstanceID: _Optional[str] = ..., Region: _Optional[str] = ...) -> None: ...
