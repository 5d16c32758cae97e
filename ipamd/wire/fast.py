"""The plugin's fast paths, all of them: the private CPython modules it imports instead of their
public wrappers, each with its public fallback. The plugin starts for every pod's ADD and DEL, and
the wrappers cost more than the rest of its start: `hashlib` loads OpenSSL (about 2 ms), `json`
pulls in `re`, `enum` and `functools`, `socket` and `struct` bring `enum` and `selectors`.

Each name is imported when first asked for (`from ipamd.wire.fast import sha1` loads `_sha1` and
nothing else), so the IPAM plugin's start loads only the two it uses (`_json`, `_socket`).

A private module can move or vanish in a CPython release. Then the fallback keeps the plugin
correct, and `fell_back` names what it lacked, so that a test on that interpreter fails
(`tests/unit/cni/test_fast_paths.py`) instead of every ADD silently growing slower.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import _socket as socket_core
    from _json import encode_basestring_ascii, make_encoder, make_scanner
    from _struct import pack, unpack_from
    from hashlib import sha1

FAST_PATHS = {
    "sha1": ("_sha1", "hashlib"),
    "encode_basestring_ascii": ("_json", ""),
    "make_encoder": ("_json", ""),
    "make_scanner": ("_json", ""),
    "socket_core": ("_socket", "socket"),
    "pack": ("_struct", "struct"),
    "unpack_from": ("_struct", "struct"),
}
"""Name -> (the private module it comes from, its public fallback; "": None, and `json` does
the work in `ipamd.wire.codec`). `socket_core` is the module itself."""

__all__ = [
    "encode_basestring_ascii",
    "fell_back",
    "make_encoder",
    "make_scanner",
    "pack",
    "sha1",
    "socket_core",
    "unpack_from",
]

fell_back: list[str] = []
"""The private modules this interpreter lacked (their fallback is in use), as names were asked."""


def __getattr__(name: str) -> object:
    if name not in FAST_PATHS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    fast, public = FAST_PATHS[name]
    try:
        module = __import__(fast)
    except ImportError:
        if fast not in fell_back:
            fell_back.append(fast)
        if not public:
            globals()[name] = None
            return None
        module = __import__(public)
    value = module if name == "socket_core" else getattr(module, name)
    globals()[name] = value
    return value
