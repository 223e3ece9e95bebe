"""torchft, imported where fault tolerance runs, or refused in one line naming the versions.

kenotron uses torchft's Manager, its reconfigurable process groups, its process-group checkpoint
transport, the lighthouse and LocalSGD/DiLoCo, as torchft 0.2 defines them (read from its
source). torchft ships a compiled extension built against one torch: a torch it cannot load
with fails at import, and that failure is said here with both versions and the fix.
"""

from __future__ import annotations

import importlib.metadata
from types import ModuleType

import torch

from kenotron.errors import ConfigError

MIN_TORCHFT = (0, 2)
"""The oldest torchft whose API kenotron is written against (Manager's register_state_dict_fn)."""


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def torchft_version() -> str | None:
    """The installed torchft's version, or None when it is not installed."""
    try:
        return importlib.metadata.version("torchft")
    except importlib.metadata.PackageNotFoundError:
        return None


def unavailable_reason() -> str | None:
    """Why torchft cannot run here (one line: not installed, too old, or it fails to load with this
    torch), or None when it can. Tests skip with this reason."""
    version = torchft_version()
    if version is None:
        return "fault_tolerance.enable needs torchft: pip install 'kenotron[ft]' (torchft==0.2.0)"
    if _version_tuple(version) < MIN_TORCHFT:
        return (f"torchft {version} is older than 0.2.0, whose API kenotron uses: "
                f"pip install 'torchft>=0.2.0' (torch {torch.__version__})")
    try:
        import torchft  # noqa: F401
        from torchft.checkpointing.pg_transport import PGTransport  # noqa: F401  (torch's private DTensor names)
    except Exception as exc:  # noqa: BLE001  (its compiled extension may not load with this torch)
        return (f"torchft {version} does not load with torch {torch.__version__} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); install the torchft built for this torch "
                f"or set fault_tolerance.enable=false")
    return None


def import_torchft() -> ModuleType:
    """The torchft module; ConfigError (one line) when it cannot run with this torch."""
    reason = unavailable_reason()
    if reason is not None:
        raise ConfigError(reason)
    import torchft

    return torchft
