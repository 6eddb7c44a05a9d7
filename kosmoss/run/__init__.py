"""Layer 6: one typed run configuration in, a trained model and ``result.json`` out."""
from .config import RunConfig

__all__ = ["RunConfig", "run"]


def __getattr__(name: str):
    # Lightning takes seconds to import: `kosmoss ghosts`, `env` and `data` must not pay it.
    if name == "run":
        from .train import run
        return run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
