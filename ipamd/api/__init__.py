"""The local HTTP API on the daemon's unix socket: `create_app` builds it, `serve_unix` serves it.

See `ipamd.api.app` for the routes, bodies and error codes.
"""

from ipamd.api.app import create_app
from ipamd.api.server import serve_unix
from ipamd.unix_socket import SocketPathError

__all__ = ["SocketPathError", "create_app", "serve_unix"]
