"""Layer 6: one frozen run configuration in, a trained model and ``result.json`` out.

    plan = prepare(config)        # every decision, nothing written (kosmoss.run.plan)
    outcome = train(plan)         # fit and exact evaluation (kosmoss.run.train)
    result = report(plan, outcome)  # result.json and the summary line (kosmoss.run.report)

:func:`run` is those three calls, with this process's run record around training.
"""
from .config import RunConfig

__all__ = ["RunConfig", "run", "prepare", "train", "report"]


def __getattr__(name: str):
    # Lightning takes seconds to import: `kosmoss ghosts`, `env` and `data` must not pay it.
    if name == "run":
        from .pipeline import run
        return run
    if name in ("prepare", "train", "report"):
        from . import pipeline
        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
