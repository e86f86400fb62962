"""The installed package's version, for ``--version`` of ``rmqpy`` and ``rmqpy-server``."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "rmqpy-store"  # [project] name in pyproject.toml


def package_version() -> str:
    """The installed distribution's version; the source tree's ``engine.__version__`` when not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        from engine import __version__

        return __version__
