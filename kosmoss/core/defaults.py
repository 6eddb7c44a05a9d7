"""The course's model and rate, in a module without torch: the model, the run's flags and
the bench's raw loop read the same numbers, and flags parse before any heavy import."""

DEFAULT_HIDDEN = (100, 100, 100)  # 3 hidden layers of 100, SiLU: the MAELSTROM course's MLP
DEFAULT_LR = 1e-3  # Adam's rate for the default per-device batch
