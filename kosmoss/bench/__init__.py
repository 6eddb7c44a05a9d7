"""``kosmoss bench``: set-ups measured side by side on one dataset and one model.

- :mod:`.setups` — the matrix: each set-up, the command that runs it, why one is skipped;
- :mod:`.baselines` — what is not kosmoss's training path: the raw PyTorch loop (the
  limit) and the two loaders; run in their own process (``python -m kosmoss.bench.baselines``);
- :mod:`.measure` — runs one set-up once, as a subprocess, and reads its figures;
- :mod:`.figures` — medians, ratios, scaling efficiency, time to the target loss, checks;
- :mod:`.report` — the rich table, bench.json, bench.csv and bench.png;
- :mod:`.runner` — the whole bench: repeats interleaved, then figures and report.
"""
