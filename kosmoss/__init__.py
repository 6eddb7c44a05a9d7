"""kosmoss: ECMWF's radiation-column MLP from a laptop CPU to distributed data parallel.

Importing kosmoss does nothing but define names: no folders, no config, no logging
handlers. Data and runs live under ``KOSMOSS_HOME`` (default ``~/.kosmoss``).
"""
__version__ = "0.1.0"


def __getattr__(name: str):
    # kosmoss.release_memory() is imported when first asked for: importing kosmoss stays cheap.
    if name == "release_memory":
        from .devices.memory import release_memory

        return release_memory
    raise AttributeError(f"module 'kosmoss' has no attribute {name!r}")
