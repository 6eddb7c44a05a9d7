"""Train the radiation-column MLP on GPUs: trainup_cpu.py plus what a GPU adds.

    python trainup_gpu.py                                       # 1 GPU (or CPU, with a warning)
    python trainup_gpu.py --gpus 2                              # DDP over 2 GPUs, NCCL
    python trainup_gpu.py --strategy ddp --gpus 1 --num-nodes 2 # 2 nodes simulated on this host
    python trainup_gpu.py --gpus 2 --gpu-ids 2,3                # local rank r on CUDA id ids[r]
    python trainup_gpu.py --precision bf16-mixed --mode device  # bf16, data resident on the GPU
    torchrun --standalone --nproc_per_node 2 trainup_gpu.py     # torchrun starts the ranks
    horovodrun -np 2 python trainup_gpu.py --strategy horovod   # Horovod (docs/horovod.md)
    sbatch slurm/submit.sbatch --dataset small                  # srun trainup_gpu.py, per task
    python trainup_gpu.py --resume <run-id>                     # continue a stopped run

What a GPU adds: the machine offers a GPU and the run asks for one (kosmoss.devices.policy);
--gpus is processes per node; more ranks than GPUs share them over gloo with 1/n of the
memory each; with no GPU the run goes on on CPU with a warning, unless --require-gpu.
"""
import sys

from kosmoss.core.commandline import OneLineParser, run_command
from kosmoss.devices.policy import MachineGpu
from kosmoss.launch.lifetime import die_with_spawner
from kosmoss.launch.records import mark_external_rank
from kosmoss.run.flags import add_gpu_flags, add_run_flags, checked_config, flag_names


def main(argv=None) -> int:
    parser = OneLineParser(prog="trainup_gpu.py", description=__doc__.split("\n\n")[0])
    add_run_flags(parser, processes=False)
    add_gpu_flags(parser)
    args = parser.parse_args(argv)

    def train() -> None:
        mark_external_rank()  # torchrun's, srun's ranks: known as kosmoss's from any home
        die_with_spawner()  # a local rank Lightning started ends with the rank that started it
        # The GPU launcher: the machine offers a GPU (KOSMOSS_MACHINE_GPU may force one or
        # none, KOSMOSS_GPU_INDEX pick one) and the run asks for one.
        config = checked_config(args, machine=MachineGpu.from_environment("offer"), use_gpu=True)
        from kosmoss.run.pipeline import run_from_command_line  # Lightning: seconds to import

        run_from_command_line(parser.prog, config)

    return run_command(parser.prog, train, flag_names("--gpus"))


if __name__ == "__main__":
    sys.exit(main())
