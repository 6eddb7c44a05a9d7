"""Train the radiation-column MLP on CPU: one process, or DDP over gloo with N.

    python trainup_cpu.py                                   # 1 process, dataset 'small'
    python trainup_cpu.py --num-processes 2                 # DDP, Lightning starts rank 1
    python trainup_cpu.py --num-processes 2 --batch-size 512 --scale-lr linear
    python trainup_cpu.py --num-nodes 2                     # 2 nodes simulated on this host
    python trainup_cpu.py --dataset tiny --max-epochs 1 --result-json /tmp/result.json
    torchrun --standalone --nproc_per_node 2 trainup_cpu.py    # torchrun starts the 2 ranks
    srun --ntasks-per-node 2 python trainup_cpu.py             # so does Slurm
    horovodrun -np 2 --gloo python trainup_cpu.py --strategy horovod  # Horovod (docs/horovod.md)
    python trainup_cpu.py --resume <run-id>                 # continue a stopped run, its settings

--batch-size is the global batch: each of the N processes gets batch-size / N.
Results go to $KOSMOSS_HOME/runs/<run-id>/ (result.json, TensorBoard, CSV, checkpoints).
Exit codes: 0 done (or stopped by SIGTERM/SIGUSR1 with a checkpoint), 1 failed (or diverged:
the weights NaN or inf), 2 bad input,
128 + signal when stopped without one (130 Ctrl-C, 143 SIGTERM): docs/reliability.md.
"""
import sys

from kosmoss.core.commandline import OneLineParser, run_command
from kosmoss.devices.policy import MachineGpu
from kosmoss.launch.lifetime import die_with_spawner
from kosmoss.launch.records import mark_external_rank
from kosmoss.run.flags import add_run_flags, checked_config, flag_names


def main(argv=None) -> int:
    parser = OneLineParser(prog="trainup_cpu.py", description=__doc__.split("\n\n")[0])
    add_run_flags(parser)
    args = parser.parse_args(argv)

    def train() -> None:
        mark_external_rank()  # torchrun's, srun's ranks: known as kosmoss's from any home
        die_with_spawner()  # a local rank Lightning started ends with the rank that started it
        # The CPU launcher: the machine offers no GPU (unless KOSMOSS_MACHINE_GPU says so)
        # and the run asks for none. Bad values are found before Lightning is imported.
        config = checked_config(args, machine=MachineGpu.from_environment("none"), use_gpu=False)
        from kosmoss.run.pipeline import run_from_command_line  # Lightning: seconds to import

        run_from_command_line(parser.prog, config)

    return run_command(parser.prog, train, flag_names())


if __name__ == "__main__":
    sys.exit(main())
