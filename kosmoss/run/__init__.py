"""Layer 6: one typed run configuration in, a trained model and ``result.json`` out."""
from .config import RunConfig
from .train import run

__all__ = ["RunConfig", "run"]
