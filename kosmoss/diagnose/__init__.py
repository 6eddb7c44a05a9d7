"""When a distributed run hangs or crawls: where each process is, which rank is slow, and
who still holds the GPU.

    kosmoss stacks [RUN] [--native] [--json] [--out FILE]   # every process's stack, grouped
    kosmoss watch [RUN] [--once] [--json]                   # per-rank live view, stragglers
    kosmoss ghosts --stacks                                 # ghosts, their causes and stacks

Modules: :mod:`.runs` (a run's live processes and who is which rank), :mod:`.stacks`
(py-spy dumps, grouped), :mod:`.heartbeat` (the callback ranks write for ``watch``),
:mod:`.watch` (the view), :mod:`.hang` (start-up check, collective timeouts, flight
recorder). Nothing here imports torch or Lightning except the two callbacks' modules.
"""
