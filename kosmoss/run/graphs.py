"""The training step in a CUDA graph (``--cuda-graphs``): K optimizer steps — each batch
gathered from the data on the GPU, forward, backward, Adam — captured once and replayed for
every chunk of K full batches (:mod:`.chunks`). A replay launches the whole chunk at once:
no Python, no kernel launch, no host round trip per step. PyTorch's whole-network capture
recipe (torch.cuda.graphs docs): eager warm-up on a side stream, then capture; Adam is
``capturable`` so its step counter lives on the GPU.

What a replay cannot do runs eagerly, with the same parameters and optimizer: a chunk
shorter than K (an epoch's end, ``--max-steps``) or with a partial batch, and the warm-up
steps of the learning rate (a captured step bakes in the rate it was captured with). A
capture that fails turns the graphs off for the run, with one warning in result.json.

On a CPU a test double stands in for the graph (:class:`EagerGraph`: it runs what would
have been captured at every replay), so the bookkeeping around replays — the loader's
position, Lightning's step counters, the logged rows, checkpoints — is tested where CI
runs; the real capture is tested on a GPU (tests/gpu).
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable, List, Optional

import numpy as np
import torch

from .lean import LeanCallback

WARMUP_CHUNKS = 1  # eager chunks on a side stream before the capture
STORE_ROWS = 65_536  # rows normalised at a time: a bounded float32 temporary


def bf16_inputs(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """``x`` normalised as LitMLP's step does it ((x - mean) / std in float32), then rounded
    to bfloat16 as autocast rounds a Linear's input: the exact values a bf16-mixed step
    feeds its first layer, made once instead of every step, in half the bytes."""
    out = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    for lo in range(0, len(x), STORE_ROWS):
        out[lo:lo + STORE_ROWS] = x[lo:lo + STORE_ROWS].sub(mean).div_(std)
    return out


class CudaGraph:
    def __init__(self, device: torch.device) -> None:
        self.device, self.graph = device, torch.cuda.CUDAGraph()

    def warm_up(self) -> contextlib.AbstractContextManager:
        """Eager steps on a side stream: their lazy set-up (cuBLAS, autograd's streams) is
        then done outside the capture."""
        return _side_stream(self.device)

    def capture(self, steps: Callable[[], None]) -> None:
        with torch.cuda.graph(self.graph):
            steps()

    def replay(self) -> None:
        self.graph.replay()

    def settle(self) -> float:
        """When the queued steps are done: a capture's time starts here, with the GPU idle."""
        torch.cuda.synchronize(self.device)
        return time.perf_counter()


class EagerGraph:
    """A graph's stand-in where there is no CUDA (tests): each replay runs the steps."""

    def __init__(self, device: torch.device) -> None:
        self.steps: Optional[Callable[[], None]] = None

    def warm_up(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def capture(self, steps: Callable[[], None]) -> None:
        self.steps = steps

    def replay(self) -> None:
        self.steps()

    def settle(self) -> float:
        return time.perf_counter()


@contextlib.contextmanager
def _side_stream(device: torch.device):
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream(device).wait_stream(stream)


class GraphedSteps:
    """K steps of ``module`` (a :class:`~kosmoss.run.chunks.StepsInChunks`) on the rows of
    ``x`` and ``y``, the training data held on the device: warmed up, captured, replayed.

    ``run(batches)`` trains one chunk's batches (index arrays into x and y) and returns
    their losses as one tensor, or None when the chunk cannot be replayed (run it eagerly).
    """

    def __init__(self, module, x: torch.Tensor, y: torch.Tensor, batch_size: int, k: int,
                 graph: Callable[[torch.device], object],
                 stored: Optional[torch.Tensor] = None) -> None:
        self.module, self.x, self.y, self.k = module, x, y, k
        self.stored = stored  # x as bf16_inputs made it: replays gather from it
        self.batch_size = batch_size
        self.static_idx = torch.zeros(k, batch_size, dtype=torch.long, device=x.device)
        # The indices go through pinned memory: a pageable copy would wait for the replay
        # before it on the GPU, and the host could not prepare the next chunk meanwhile.
        cuda = x.device.type == "cuda"
        self.host_idx = torch.zeros(k, batch_size, dtype=torch.long, pin_memory=cuda)
        self.copied = torch.cuda.Event() if cuda else None
        self.graph = graph(x.device)
        self.losses: Optional[torch.Tensor] = None
        self.warm_chunks = self.replays = 0
        self.failed: Optional[str] = None
        # The last run's timing, for the step clock (kosmoss.run.throughput): the seconds
        # its capture took (set-up, no training step's time), and when each of its steps
        # ended if it ran them one by one (a warm-up chunk: its first step holds
        # torch.compile's compilation, which the clock must not spread over the others).
        self.set_up_s: float = 0.0
        self.step_ends: List[float] = []
        self.capture_s = 0.0  # every capture of the run: result.json's cuda_graphs

    def _timed(self) -> None:
        self.set_up_s, self.step_ends = 0.0, []

    def replayable(self, batches: List[np.ndarray]) -> bool:
        return (self.failed is None and len(batches) == self.k
                and all(len(batch) == self.batch_size for batch in batches))

    def run(self, batches: List[np.ndarray]) -> Optional[torch.Tensor]:
        self._timed()
        if not self.replayable(batches):
            return None
        self._copy_indices(batches)
        if self.warm_chunks < WARMUP_CHUNKS:
            with self.graph.warm_up():
                losses = self._steps(self.step_ends)
            self.warm_chunks += 1
            return losses
        if self.losses is None:
            began = self.graph.settle()
            captured = self._capture()
            self.set_up_s = time.perf_counter() - began
            self.capture_s += self.set_up_s
            if not captured:
                return None
        self.graph.replay()
        self.replays += 1
        return self.losses.clone()  # the next replay writes over them

    def eager(self, batches: List[np.ndarray]) -> torch.Tensor:
        """A chunk no replay can take (shorter than K, a partial batch, a failed capture),
        run eagerly by the replays' own step on their stored bf16 inputs: the compiled
        network sees the inputs it was compiled for. The float32 path compiled it a second
        time, inside the timed steps: on the H200 (2026-11-27) the 5-step eager chunk at the
        end of a 301-step run took about 3 s, and the row read 1.5 M samples/s where its
        replays' ladder rung ran 22.6 M (docs/gpu/2026-11-27-h200-ladder.md)."""
        self._timed()
        losses = []
        for batch in batches:
            losses.append(self._step(torch.as_tensor(batch, device=self.x.device)))
            self.step_ends.append(time.perf_counter())
        return torch.stack(losses)

    def _copy_indices(self, batches: List[np.ndarray]) -> None:
        if self.copied is not None:
            self.copied.synchronize()  # the last copy out of host_idx is done
        self.host_idx.numpy()[:] = np.stack(batches)
        self.static_idx.copy_(self.host_idx, non_blocking=self.copied is not None)
        if self.copied is not None:
            self.copied.record()

    def _capture(self) -> bool:
        self.module.raw_optimizer().zero_grad(set_to_none=True)
        try:
            self.graph.capture(self._capture_into_losses)
        except Exception as err:  # any capture failure: eager from here on, and say so
            self.failed = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            self.module.raw_optimizer().zero_grad(set_to_none=True)
            return False
        return True

    def _capture_into_losses(self) -> None:
        self.losses = self._steps()

    def _steps(self, ends: Optional[List[float]] = None) -> torch.Tensor:
        losses = []
        for j in range(self.k):
            losses.append(self._step(self.static_idx[j]))
            if ends is not None:
                ends.append(time.perf_counter())
        return torch.stack(losses)

    def _step(self, idx: torch.Tensor) -> torch.Tensor:
        """One step as the eager loop makes it, on the rows ``idx`` gathered on the device."""
        y = torch.index_select(self.y, 0, idx)
        if self.stored is not None:
            loss = self.module.loss_of_normalised(torch.index_select(self.stored, 0, idx), y)
        else:
            loss = self.module._common_step((torch.index_select(self.x, 0, idx), y), "train")
        optimizer = self.module.raw_optimizer()
        optimizer.zero_grad(set_to_none=True)
        with self.module.backward_context():
            loss.backward()
        optimizer.step()
        return loss.detach()


class GraphsOnTheDevice(LeanCallback):
    """Gives a StepsInChunks model its GraphedSteps once the data sits on its device, and
    says afterwards how its chunks were trained (result.json ``cuda_graphs``).

    In bf16-mixed the replays gather their inputs from a bf16 copy normalised once (the
    ladder's bf16-store rung: the same values, no per-step normalisation and cast, half the
    bytes), where the GPU has room for it beside the data; ``inputs`` in the report says
    which."""

    def __init__(self, batch_size: int, steps: int, graph=None, bf16_store: bool = True) -> None:
        self.batch_size, self.steps, self.graph = batch_size, steps, graph
        self.bf16_store = bf16_store

    def on_train_start(self, trainer, pl_module) -> None:
        held = trainer.datamodule.data.resident()
        x, y = held[0], held[1]
        graph = self.graph or (CudaGraph if x.device.type == "cuda" else EagerGraph)
        stored, pl_module.graph_inputs = self._store(trainer, pl_module, x)
        pl_module.graphs = GraphedSteps(pl_module, x, y, self.batch_size, self.steps, graph,
                                        stored)

    def _store(self, trainer, pl_module, x: torch.Tensor):
        # bf16-mixed alone: autocast casts float32 normalised inputs (bf16-true normalises
        # in bf16 itself)
        if not (self.bf16_store and trainer.precision == "bf16-mixed"):
            return None, "float32, normalised every step"
        need = x.numel() * 2
        if x.device.type == "cuda" and torch.cuda.mem_get_info(x.device)[0] < 1.25 * need:
            return None, f"float32, normalised every step: no room for a {need / 2**20:,.0f} " \
                         "MiB bf16 copy on the GPU"
        stored = bf16_inputs(x, pl_module.x_mean, pl_module.x_std)
        return stored, f"bf16, normalised once ({need / 2**20:,.0f} MiB)"

    @staticmethod
    def report(pl_module) -> dict:
        graphs = getattr(pl_module, "graphs", None)
        return {"replays": graphs.replays if graphs else 0,
                "warm_up_chunks": graphs.warm_chunks if graphs else 0,
                "capture_s": round(graphs.capture_s, 3) if graphs else 0.0,
                "eager_chunks": getattr(pl_module, "eager_chunks", 0),
                "capture_failed": graphs.failed if graphs else None,
                "inputs": getattr(pl_module, "graph_inputs", None)}
