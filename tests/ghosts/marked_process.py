"""A process that joins a kosmoss run the way ``kosmoss.run.train.run`` does
(``kosmoss.launch.records.start``), then sleeps: the record rules tested on real processes without
the cost of importing torch. ``--spawn`` starts a second one the way Lightning starts rank 1
(from ``os.environ``, which carries the marks); ``--fork-worker`` forks a child the way a
DataLoader does; ``--finish STATE`` ends its part of the run and lives on (``--child-finish``:
the spawned one does); ``--listen PORT`` listens on a TCP port as rank 0 listens on
MASTER_PORT (``--child-listen PORT``: the spawned one does); ``--cuda-mib N`` holds N MiB
on the GPU and writes ``<run_dir>/cuda-<pid>`` once it does (``--child-cuda-mib N``: the
spawned one does)."""
import argparse
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from kosmoss.launch import records


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--kind", default="lightning")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--spawn", action="store_true")
    parser.add_argument("--fork-worker", action="store_true")
    parser.add_argument("--finish")
    parser.add_argument("--child-finish")
    parser.add_argument("--listen", type=int)
    parser.add_argument("--child-listen", type=int)
    parser.add_argument("--cuda-mib", type=int)
    parser.add_argument("--child-cuda-mib", type=int)
    args = parser.parse_args()
    records.start(args.run_dir, kind=args.kind, global_rank=args.rank)
    if args.listen:
        listener = socket.create_server(("127.0.0.1", args.listen))  # noqa: F841 (held)
    if args.spawn:
        finish = ["--finish", args.child_finish] if args.child_finish else []
        listen = ["--listen", str(args.child_listen)] if args.child_listen else []
        cuda = ["--cuda-mib", str(args.child_cuda_mib)] if args.child_cuda_mib else []
        subprocess.Popen([sys.executable, __file__, str(args.run_dir), "--kind", args.kind,
                          "--rank", "1", *finish, *listen, *cuda])
    if args.cuda_mib:
        import torch

        held = torch.empty(args.cuda_mib * 2**20, dtype=torch.uint8, device="cuda")  # noqa: F841
        torch.cuda.synchronize()
        (args.run_dir / f"cuda-{os.getpid()}").touch()
    if args.fork_worker:
        multiprocessing.get_context("fork").Process(target=time.sleep, args=(120,)).start()
    if args.finish:
        records.finish(args.finish)
    time.sleep(120)


if __name__ == "__main__":
    main()
