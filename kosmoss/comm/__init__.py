"""``kosmoss comm``: all-reduce bandwidth through torch.distributed, on ranks it starts.

- :mod:`.figures` — sizes, algbw, busbw (nccl-tests' factors), the α–β fit;
- :mod:`.ranks` — starts the ranks (simulated nodes too) and times each size;
- :mod:`.measure` — one whole measurement: plan, ranks, figures, fits (comm.json);
- :mod:`.report` — the rich table, comm.json, comm.csv, comm.png.

    kosmoss comm --ranks 2 --max-size 64M          # gloo on CPU, under a minute on 2 cores
    kosmoss comm --ranks 4 --nodes 2 --json        # 2 simulated nodes x 2 ranks
"""
