"""zeps: ZooKeeper-coordinated messaging for Kubernetes.

The facade: everything a user needs is named in ``__all__``; every other module is private
unless its own docstring says otherwise (``zeps.coordination.testing``, ``zeps.dev``).
"""

from importlib.metadata import version as _version

from zeps.errors import (
    ConfigError,
    CoordinationError,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    SetupError,
    ZepsError,
)

__version__ = _version("zeps")  # one source of truth: pyproject.toml

__all__ = [
    "ConfigError",
    "CoordinationError",
    "LocalProtocolError",
    "ProtocolError",
    "RemoteProtocolError",
    "SetupError",
    "ZepsError",
    "__version__",
]
