"""Run Lightning's collectives through one strategy and write what each rank got.

    horovodrun -np 2 --gloo python collectives_probe.py horovod OUT_DIR
    torchrun --standalone --nproc_per_node 2 collectives_probe.py ddp OUT_DIR

test_collectives.py runs both and compares the files rank by rank: the Horovod strategy
must answer exactly what Lightning's DDPStrategy over torch.distributed answers.
"""
import json
import sys
from pathlib import Path

import torch
from pytorch_lightning.accelerators import CPUAccelerator
from torch.distributed import ReduceOp

WORLD = 2


def make_strategy(engine: str):
    devices = [torch.device("cpu")] * WORLD
    if engine == "horovod":
        from kosmoss.engines.horovod import HorovodStrategy

        return HorovodStrategy(accelerator=CPUAccelerator(), parallel_devices=devices)
    from lightning_fabric.plugins.environments import TorchElasticEnvironment
    from pytorch_lightning.strategies import DDPStrategy

    strategy = DDPStrategy(accelerator=CPUAccelerator(), parallel_devices=devices,
                           cluster_environment=TorchElasticEnvironment(),
                           process_group_backend="gloo")
    strategy.setup_distributed()
    return strategy


def described(value):
    if isinstance(value, torch.Tensor):
        return {"values": value.tolist(), "dtype": str(value.dtype), "shape": list(value.shape)}
    return value


def probe(strategy) -> dict:
    rank = strategy.global_rank
    out = {"rank": rank, "world_size": strategy.world_size}
    floats = torch.tensor([rank + 1.5, -2.0 * rank, 0.25])
    for op in ("mean", "sum", "max", "min"):
        out[f"reduce_{op}"] = described(strategy.reduce(floats.clone(), reduce_op=op))
    out["reduce_default"] = described(strategy.reduce(floats.clone()))
    out["reduce_enum_sum"] = described(strategy.reduce(floats.clone(), reduce_op=ReduceOp.SUM))
    out["reduce_int_sum"] = described(strategy.reduce(torch.tensor([rank + 1, 7]), reduce_op="sum"))
    out["reduce_int_mean"] = described(strategy.reduce(torch.tensor(rank + 2), reduce_op="mean"))
    scalar = torch.tensor(float(rank))
    out["reduce_in_place"] = strategy.reduce(scalar, reduce_op="sum") is scalar and float(scalar) == 1.0
    out["reduce_not_a_tensor"] = strategy.reduce(3.5)
    out["all_true"] = strategy.reduce_boolean_decision(rank == 0, all=True)
    out["any_true"] = strategy.reduce_boolean_decision(rank == 0, all=False)
    out["gather_scalar"] = described(strategy.all_gather(torch.tensor(rank * 10.0)))
    out["gather_vector"] = described(strategy.all_gather(torch.tensor([rank, rank + 1])))
    out["gather_matrix"] = described(strategy.all_gather(torch.full((2, 3), float(rank))))
    out["broadcast_from_0"] = strategy.broadcast({"from": rank, "items": [rank, "x"]}, src=0)
    out["broadcast_from_1"] = strategy.broadcast(f"rank {rank}", src=1)
    strategy.barrier()
    out["after_barrier"] = True
    return out


def main(engine: str, out_dir: str) -> None:
    strategy = make_strategy(engine)
    result = probe(strategy)
    Path(out_dir, f"{engine}-rank{result['rank']}.json").write_text(json.dumps(result, indent=1))
    strategy.barrier()
    if engine == "ddp":
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
