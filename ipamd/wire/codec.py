"""Reading and writing the local socket's bodies, cheaply enough for the plugin's start: JSON
(`parse_object` for requests, strict; `parse_answer` for the daemon's answers, as `json.loads` reads
them; `dumps`, compact ASCII), the field checks the body types of `ipamd.wire` are made of, their
value-type base (`Value`), and `WireError`, the error of a body that does not have the accepted shape.

The `json` package pulls in `re` (and `enum`, `functools`, ...): imported on every pod's ADD and DEL
it would cost the plugin several times a bare interpreter's start. So JSON goes through `_json`, the
C accelerator `json` itself runs on, with the settings `json.loads` and `json.dumps` use; `json` is
imported only to word the error of a body that is not JSON (or where `_json` is missing:
`ipamd.wire.fast`). Nothing
here may import `re`, `typing`, `enum`, `dataclasses` or `collections` at run time.
"""

from __future__ import annotations

from ipamd.wire.fast import encode_basestring_ascii as _encode_string
from ipamd.wire.fast import make_encoder as _make_encoder
from ipamd.wire.fast import make_scanner as _make_scanner

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

_JSON_WHITESPACE = " \t\n\r"
"""What `json` skips around a document (JSON's whitespace; not `str.isspace`'s)."""


class WireError(ValueError):
    """A request that does not have the shape the API accepts; the message names the field."""


def _reject_constant(name: str) -> object:
    raise WireError(f"{name} is not valid JSON")


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    obj: dict[str, object] = {}
    for name, value in pairs:
        if name in obj:
            raise WireError(f"duplicate field {name!r}")
        obj[name] = value
    return obj


_FLOAT_CONSTANTS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


class _Decoding:
    """The settings `_json.make_scanner` reads from a `json.JSONDecoder` (attributes, read once),
    with `json.loads`'s values for those not given; and the scanner made of them."""

    __slots__ = (
        "object_hook",
        "object_pairs_hook",
        "parse_constant",
        "parse_float",
        "parse_int",
        "scan",
        "strict",
    )

    def __init__(
        self,
        object_pairs_hook: Callable[[list[tuple[str, object]]], object] | None,
        parse_constant: Callable[[str], object],
    ) -> None:
        self.strict = True
        self.object_hook = None
        self.object_pairs_hook = object_pairs_hook
        self.parse_float = float
        self.parse_int = int
        self.parse_constant = parse_constant
        self.scan: Callable[[str, int], tuple[object, int]] | None = (
            None if _make_scanner is None else _make_scanner(self)  # type: ignore[arg-type]
        )

    def loads(self, text: str) -> object:
        """`json.loads(text)` with these hooks: the same scanner, the same whitespace rules."""
        if self.scan is not None:
            start = len(text) - len(text.lstrip(_JSON_WHITESPACE))
            try:
                value, end = self.scan(text, start)
            except WireError:
                raise
            except (StopIteration, SystemError, ValueError):
                # Not JSON, or not only JSON. `_json` raises json.decoder's JSONDecodeError, which
                # it looks up in sys.modules: before any `import json` it fails with SystemError.
                # json.loads below parses again and words the error.
                pass
            else:
                if not text[end:].lstrip(_JSON_WHITESPACE):
                    return value
        import json

        try:
            return json.loads(
                text, object_pairs_hook=self.object_pairs_hook, parse_constant=self.parse_constant
            )
        except json.JSONDecodeError as err:
            raise WireError(
                f"body is not JSON: {err.msg} at line {err.lineno} column {err.colno}"
            ) from None
        except ValueError as err:
            # Valid JSON that Python refuses to read: an integer of more than
            # sys.get_int_max_str_digits() digits (CVE-2020-10735's limit).
            raise WireError(f"body holds a value that cannot be read: {err}") from None


_STRICT = _Decoding(_no_duplicates, _reject_constant)
_LENIENT = _Decoding(None, _FLOAT_CONSTANTS.__getitem__)


def _decode(raw: bytes, decoding: _Decoding) -> object:
    try:
        return decoding.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise WireError(f"body is not UTF-8: {err.reason}") from None
    except RecursionError:
        raise WireError("body is nested too deeply") from None


def parse_object(raw: bytes) -> dict[str, object]:
    """A JSON object from UTF-8 bytes: no NaN/Infinity, no duplicate keys, an object at the top."""
    value = _decode(raw, _STRICT)
    if not isinstance(value, dict):
        raise WireError("body must be a JSON object")
    return value


def parse_answer(raw: bytes) -> object:
    """Any JSON value from UTF-8 bytes, read as `json.loads` reads it: the daemon's answers, which
    the response types check field by field."""
    return _decode(raw, _LENIENT)


def _unserializable(obj: object) -> object:
    raise TypeError(f"Object of type {obj.__class__.__name__} is not JSON serializable")


def dumps(obj: object) -> str:
    """Compact JSON, ASCII only: what `json.dumps(obj, separators=(",", ":"))` writes."""
    if _make_encoder is None:
        import json

        return json.dumps(obj, separators=(",", ":"))
    # A fresh encoder per call: its `markers` (the circular-reference check) must start empty.
    encode = _make_encoder({}, _unserializable, _encode_string, None, ":", ",", False, False, True)
    return "".join(encode(obj, 0))


def fields_of(
    obj: object, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> Mapping[str, object]:
    if not isinstance(obj, dict):
        raise WireError(f"{where} must be a JSON object")
    unknown = sorted(set(obj) - set(required) - set(optional))
    if unknown:
        raise WireError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}")
    missing = [name for name in required if name not in obj]
    if missing:
        raise WireError(f"{where}: missing field(s) {', '.join(map(repr, missing))}")
    return obj


def string_field(obj: Mapping[str, object], name: str, where: str, max_len: int) -> str:
    value = obj.get(name, "")
    if not isinstance(value, str):
        raise WireError(f"{where}.{name} must be a string")
    if len(value) > max_len:
        raise WireError(f"{where}.{name} is longer than {max_len} characters")
    if not value.isprintable():
        raise WireError(f"{where}.{name} holds control characters")
    return value


def text_field(obj: Mapping[str, object], name: str, where: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str):
        raise WireError(f"{where}.{name} must be a string")
    return value


def number_field(obj: Mapping[str, object], name: str, where: str) -> float:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WireError(f"{where}.{name} must be a number")
    return float(value)


def response_object(obj: object, where: str) -> Mapping[str, object]:
    if not isinstance(obj, dict):
        raise WireError(f"{where} must be a JSON object")
    return obj


class Value:
    """What `@dataclass(frozen=True, slots=True)` gave these types, without importing dataclasses:
    the fields are the `__slots__`, equality and hash by class and fields, a repr naming them, no
    assignment after `__init__` (which sets each field by name), copy and pickle. Only the repr
    follows the order of `__slots__`, which lists the fields as the constructor does."""

    __slots__: tuple[str, ...] = ()

    def _init(self, **fields: object) -> None:
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Value)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{self.__class__.__qualname__}({fields})"

    if not TYPE_CHECKING:  # mypy would take a __setattr__ to allow assigning any name

        def __setattr__(self, name: str, value: object) -> None:
            raise AttributeError(f"cannot assign to field {name!r}")

        def __delattr__(self, name: str) -> None:
            raise AttributeError(f"cannot delete field {name!r}")

    def __getstate__(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict[str, object]) -> None:
        self._init(**state)
