"""Train the radiation-column MLP on CPU: one process, or DDP over gloo with N.

    python trainup_cpu.py                                   # 1 process, dataset 'small'
    python trainup_cpu.py --num-processes 2                 # DDP, Lightning starts rank 1
    python trainup_cpu.py --num-processes 2 --batch-size 512 --scale-lr linear
    python trainup_cpu.py --num-nodes 2                     # 2 nodes simulated on this host
    python trainup_cpu.py --dataset tiny --max-epochs 1 --result-json /tmp/result.json
    torchrun --standalone --nproc_per_node 2 trainup_cpu.py    # torchrun starts the 2 ranks
    srun --ntasks-per-node 2 python trainup_cpu.py             # so does Slurm
    horovodrun -np 2 --gloo python trainup_cpu.py --strategy horovod  # Horovod (docs/horovod.md)

--batch-size is the global batch: each of the N processes gets batch-size / N.
Results go to $KOSMOSS_HOME/runs/<run-id>/ (result.json, TensorBoard, CSV, checkpoints).
"""
import sys

from kosmoss.cli_support import OneLineParser, run_command
from kosmoss.devices import MachineGpu
from kosmoss.run.flags import add_run_flags, config_from_args, flag_names


def main(argv=None) -> int:
    parser = OneLineParser(prog="trainup_cpu.py", description=__doc__.split("\n\n")[0])
    add_run_flags(parser)
    args = parser.parse_args(argv)

    def train() -> None:
        from kosmoss.run import run  # Lightning is slow to import: after the flags parse

        # The CPU launcher: the machine offers no GPU (unless KOSMOSS_MACHINE_GPU says so)
        # and the run asks for none.
        run(config_from_args(args, machine=MachineGpu.from_environment("none"), use_gpu=False))

    return run_command(parser.prog, train, flag_names())


if __name__ == "__main__":
    sys.exit(main())
