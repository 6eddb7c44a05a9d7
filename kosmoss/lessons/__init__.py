"""The course: its lessons (:mod:`.course`: where they ship, copying them into a working
folder, the helpers every lesson imports from here) and the web site built from them
(:mod:`.site`); why ranks forked from a kernel that ran a backward fail on a GPU
(:mod:`.forks`). The exercises and their checkers are :mod:`kosmoss.exercises`."""
from .course import (QUICK_ENV, forked, lesson_sources, on_ranks, one_thread_per_forked_rank,
                     quick, quiet_lightning, recorded_gpu, scratch_folder, script, sh,
                     source_root)

__all__ = ["QUICK_ENV", "forked", "lesson_sources", "on_ranks", "one_thread_per_forked_rank",
           "quick", "quiet_lightning", "recorded_gpu", "scratch_folder", "script", "sh", "source_root"]
