"""Types shared by the daemon's API and the CNI plugin: what crosses the local socket.

Standard library only, so the plugin stays quick to start.
"""

from __future__ import annotations

CNI_VERSION = "1.1.0"
SUPPORTED_CNI_VERSIONS = ("0.4.0", "1.0.0", "1.1.0")
