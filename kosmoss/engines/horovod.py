"""Horovod as a Lightning 2.x strategy.

Lightning 2.0 removed its ``HorovodStrategy`` and ``lightning-horovod`` does not import on
Lightning >= 2.1, so kosmoss carries this one (after Lightning 1.9's
``pytorch_lightning/strategies/horovod.py``, on today's ``ParallelStrategy`` API).

    horovodrun -np 2 --gloo python trainup_gpu.py --strategy horovod

horovodrun starts the ranks; this strategy joins them (``hvd.init()``), broadcasts rank 0's
weights and optimizer state, wraps the optimizers in ``hvd.DistributedOptimizer`` (an
allreduce of the gradients after every backward), and answers Lightning's collectives
(reduce, all_gather, broadcast, barrier) with Horovod's. Unlike Lightning 1.9 it does not
multiply the learning rate by the world size: kosmoss.scaling.arithmetic applies the one explicit
``--scale-lr`` rule for DDP and Horovod alike.

Horovod itself is imported only when a strategy is built, so kosmoss imports without it.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any, Dict, Iterator, List, Optional, Union

import torch
from lightning_fabric.plugins.environments import ClusterEnvironment
from pytorch_lightning.strategies import ParallelStrategy
from pytorch_lightning.trainer.states import TrainerFn
from pytorch_lightning.utilities import rank_zero_only
from torch import Tensor
from torch.optim import Optimizer

from ..core.errors import ConfigError, UsageError
from ..devices.cpus import cores_per_process
from ..devices.policy import Sharing
from ..run import lightning_private as private
from .base import Engine

INSTALL_COMMAND = "bash scripts/install_horovod.sh"


def import_problem() -> Optional[str]:
    """Why ``horovod.torch`` cannot be used here (None when it can)."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or spec.origin is None:  # None: a folder named horovod, not the package
        return "Horovod is not installed"
    try:
        hvd = importlib.import_module("horovod.torch")
    except ImportError as error:  # e.g. built against another torch: undefined symbols
        return f"horovod.torch does not import ({str(error).splitlines()[0][:120]})"
    if not hvd.gloo_built():
        return "this Horovod was built without gloo"
    return None


def available() -> bool:
    return import_problem() is None


def require():
    """``horovod.torch``, or a one-line :class:`UsageError` naming the install command."""
    problem = import_problem()
    if problem:
        raise UsageError(f"--strategy horovod: {problem}; build it once with `{INSTALL_COMMAND}` "
                         "(about 12 minutes on 2 cores, then cached; see docs/horovod.md)")
    return importlib.import_module("horovod.torch")


def init():
    """``hvd.init()`` once per process (it is a no-op when already initialised)."""
    hvd = require()
    if not hvd.is_initialized():
        hvd.init()
    return hvd


def shared_run_id(candidate: str) -> str:
    """Rank 0's run id on every rank (horovodrun gives its ranks no common job id)."""
    return init().broadcast_object(candidate, root_rank=0)


def backend_reason(on_gpu: bool, ranks_on_host: int) -> str:
    """What carries Horovod's allreduce in this run, for the "backend:" line."""
    hvd = require()
    if on_gpu and hvd.nccl_built():
        return "horovod: NCCL between GPUs (horovodrun starts the ranks)"
    threads = os.environ.get("OMP_NUM_THREADS") or cores_per_process(ranks_on_host)
    return f"horovod: gloo, {threads} torch thread(s) per rank (horovodrun starts the ranks)"


def cpu_threads_per_rank(local_size: int) -> None:
    """Each rank computes on its share of the cores. Horovod's background thread must get a
    core to run its collectives; torch threads spinning on every core starved it here
    (587 against 5,270 samples/s, 2 ranks on 2 cores, docs/horovod.md). torchrun sets
    OMP_NUM_THREADS=1 for the same reason; a value the user set wins."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(cores_per_process(local_size))


class HorovodEnvironment(ClusterEnvironment):
    """Ranks as Horovod knows them after ``hvd.init()`` (horovodrun set them, or size 1).
    ``join=False`` reads horovodrun's HOROVOD_* variables instead, without joining yet."""

    def __init__(self, join: bool = True) -> None:
        self._hvd = init() if join else _HorovodrunVariables()

    @property
    def creates_processes_externally(self) -> bool:
        return True  # horovodrun (or the user's single process): Lightning never spawns

    @property
    def main_address(self) -> str:
        return os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT", 0))

    @staticmethod
    def detect() -> bool:
        return "HOROVOD_RANK" in os.environ

    def world_size(self) -> int:
        return self._hvd.size()

    def set_world_size(self, size: int) -> None:
        pass  # horovodrun decides; Lightning's value is ignored, as for torchrun

    def global_rank(self) -> int:
        return self._hvd.rank()

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return self._hvd.local_rank()

    def node_rank(self) -> int:
        return self._hvd.cross_rank()


class _HorovodrunVariables:
    """What horovodrun tells each rank before ``hvd.init()``, as hvd's own answers."""

    def size(self) -> int:
        return int(os.environ.get("HOROVOD_SIZE", 1))

    def rank(self) -> int:
        return int(os.environ.get("HOROVOD_RANK", 0))

    def local_rank(self) -> int:
        return int(os.environ.get("HOROVOD_LOCAL_RANK", 0))

    def cross_rank(self) -> int:
        return int(os.environ.get("HOROVOD_CROSS_RANK", 0))


def _gather_for_metrics(result: Tensor, group: Optional[Any] = None) -> List[Tensor]:
    """torchmetrics' ``dist_sync_fn``: every rank's state tensor, in rank order."""
    hvd = importlib.import_module("horovod.torch")
    # allgather_object: metric states may differ in shape between ranks (torchmetrics pads
    # them for torch.distributed; pickling sidesteps that).
    return [value.to(result.device) for value in hvd.allgather_object(result.detach().cpu())]


def _horovod_running() -> bool:
    return importlib.import_module("horovod.torch").is_initialized()


class HorovodStrategy(ParallelStrategy):
    """Data parallel training over Horovod (gloo on CPU, NCCL on GPU when built with it)."""

    strategy_name = "horovod"

    def __init__(self, accelerator=None, parallel_devices: Optional[List[torch.device]] = None,
                 checkpoint_io=None, precision_plugin=None) -> None:
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=HorovodEnvironment(), checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin)
        self._hvd = init()
        rank_zero_only.rank = self.global_rank
        self._exit_stack: Optional[ExitStack] = None
        self._metric_sync: Dict[Any, tuple] = {}

    # -- where this rank runs -------------------------------------------------------------

    @property
    def root_device(self) -> torch.device:
        assert self.parallel_devices, "the Trainer sets parallel_devices before use"
        if self.parallel_devices[0].type == "cpu":
            return torch.device("cpu")
        if self.local_rank >= len(self.parallel_devices):
            raise UsageError(f"horovodrun started {self._hvd.local_size()} ranks on this host "
                             f"but the Trainer has {len(self.parallel_devices)} GPU(s): give "
                             "one GPU per rank (--gpus, or horovodrun -np)")
        return self.parallel_devices[self.local_rank]

    @property
    def distributed_sampler_kwargs(self) -> Dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    @property
    def is_distributed(self) -> bool:
        return True

    def setup_environment(self) -> None:
        self._hvd = init()
        if self.root_device.type == "cpu":
            cpu_threads_per_rank(self._hvd.local_size())
        super().setup_environment()

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    # -- model and optimizers ---------------------------------------------------------------

    def setup(self, trainer) -> None:
        super().setup(trainer)  # model to device, optimizers created
        self._exit_stack = ExitStack()
        self._use_horovod_for_metrics()
        _evaluate_under_no_grad(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        if trainer.accumulate_grad_batches != 1:
            raise UsageError("the Horovod strategy does not accumulate gradients: use "
                             "accumulate_grad_batches=1 (or a larger batch)")
        assert self.lightning_module is not None
        # Every rank starts from rank 0's weights (DDP does the same when it wraps the model).
        self._hvd.broadcast_parameters(self.lightning_module.state_dict(), root_rank=0)
        wrapped = [self._distributed(optimizer) for optimizer in self.optimizers]
        self._follow_with_schedulers(dict(zip(map(id, self.optimizers), wrapped)))
        self.optimizers = wrapped
        self._broadcast_optimizer_states()
        for optimizer in self.optimizers:
            # post_backward waits for the allreduce, so that gradient clipping (between
            # backward and step) sees averaged gradients; step must not wait a second time.
            self._exit_stack.enter_context(optimizer.skip_synchronize())

    def _distributed(self, optimizer: Optimizer) -> Optimizer:
        if type(optimizer).__module__ == "horovod.torch.optimizer":
            return optimizer  # already wrapped (a second fit on the same Trainer)
        assert self.lightning_module is not None
        mine = {id(p) for group in optimizer.param_groups for p in group["params"]}
        named = [(name, p) for name, p in self.lightning_module.named_parameters() if id(p) in mine]
        return self._hvd.DistributedOptimizer(optimizer, named_parameters=named)

    def _follow_with_schedulers(self, wrapped_by_id: Dict[int, Optimizer]) -> None:
        # A resumed optimizer's load_state_dict replaces its param groups: a scheduler still
        # holding the unwrapped optimizer would set a learning rate nobody reads.
        for config in self.lr_scheduler_configs:
            wrapped = wrapped_by_id.get(id(config.scheduler.optimizer))
            if wrapped is not None:
                config.scheduler.optimizer = wrapped
                _mark_step_tracked(wrapped)

    def _broadcast_optimizer_states(self) -> None:
        for optimizer in self.optimizers:
            # A fresh optimizer has no state on any rank; Horovod would create one with a
            # zero-gradient step (Adam's step count 1, weight decay applied): skip that.
            if optimizer.state_dict()["state"]:
                self._hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def load_optimizer_state_dict(self, checkpoint) -> None:
        super().load_optimizer_state_dict(checkpoint)
        self._broadcast_optimizer_states()  # a resumed run: rank 0's state everywhere

    def post_backward(self, closure_loss: Tensor) -> None:
        for optimizer in self.optimizers:
            optimizer.synchronize()

    @contextmanager
    def block_backward_sync(self) -> Iterator[None]:
        yield  # no accumulation (checked in setup), so there is nothing to block

    # -- collectives ------------------------------------------------------------------------

    def reduce(self, tensor: Union[Tensor, Any], group: Optional[Any] = None,
               reduce_op: Optional[Union[Any, str]] = "mean") -> Union[Tensor, Any]:
        """In place, like Lightning's DDP reduce: a mean is a sum divided by the world size."""
        if not isinstance(tensor, Tensor):
            return tensor
        _no_groups(group)
        name = _op_name(reduce_op)
        ops = {"sum": self._hvd.Sum, "avg": self._hvd.Sum, "max": self._hvd.Max,
               "min": self._hvd.Min, "product": self._hvd.Product}
        if name not in ops:
            raise ValueError(f"Horovod strategy: unsupported reduce_op {reduce_op!r}")
        self._hvd.allreduce_(tensor, op=ops[name])
        if name != "avg":
            return tensor
        if not torch.is_floating_point(tensor):
            return tensor.copy_(tensor / self.world_size)
        return tensor.div_(self.world_size)

    def all_gather(self, tensor: Tensor, group: Optional[Any] = None,
                   sync_grads: bool = False) -> Tensor:
        """Shape (world_size, *tensor.shape), as Lightning's DDP all_gather returns."""
        _no_groups(group)
        with nullcontext() if sync_grads else torch.no_grad():
            return self._hvd.allgather(tensor.contiguous().unsqueeze(0))

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return self._hvd.broadcast_object(obj, root_rank=src)

    def barrier(self, name: Optional[str] = None) -> None:
        if _horovod_running():
            self._hvd.barrier()

    # -- the end ----------------------------------------------------------------------------

    def teardown(self) -> None:
        """End of one Trainer stage (fit, validate, test). Horovod stays up for the next
        stage: a second ``hvd.init()`` after ``hvd.shutdown()`` races on horovodrun's
        rendezvous store (2 of 6 tries here aborted with gloo "Connection refused"), so
        the process shuts it down once, at the end (:func:`shutdown`)."""
        if self._exit_stack is not None:
            self._exit_stack.close()
            self._exit_stack = None
        self._restore_metric_sync()
        if _horovod_running():
            self._hvd.barrier()  # no rank leaves the stage while another still needs it
        super().teardown()

    # -- torchmetrics -----------------------------------------------------------------------

    def _use_horovod_for_metrics(self) -> None:
        """torchmetrics syncs through torch.distributed, which Horovod does not start:
        point every Metric of the module at Horovod instead (restored in teardown)."""
        from torchmetrics import Metric

        assert self.lightning_module is not None
        for metric in self.lightning_module.modules():
            if isinstance(metric, Metric) and metric not in self._metric_sync:
                self._metric_sync[metric] = (metric.dist_sync_fn, metric.distributed_available_fn)
                metric.dist_sync_fn = _gather_for_metrics
                metric.distributed_available_fn = _horovod_running

    def _restore_metric_sync(self) -> None:
        for metric, (sync_fn, available_fn) in self._metric_sync.items():
            metric.dist_sync_fn, metric.distributed_available_fn = sync_fn, available_fn
        self._metric_sync.clear()


def shutdown() -> None:
    """Stop Horovod's background thread and gloo context: once, when the run is over."""
    if importlib.util.find_spec("horovod") is not None and _horovod_running():
        importlib.import_module("horovod.torch").shutdown()


def _evaluate_under_no_grad(trainer) -> None:
    """Horovod's background thread fills collective outputs outside the caller's
    ``torch.inference_mode``, where tensors made inside it cannot be written ("Inplace update
    to inference tensor outside InferenceMode"): evaluate under ``no_grad``, as Lightning
    does for gloo DDP (loops/utilities.py, ``_no_grad_context``)."""
    for loop in private.evaluation_loops(trainer):
        loop.inference_mode = False


def _mark_step_tracked(optimizer: Optimizer) -> None:
    """torch's LR schedulers wrap ``optimizer.step`` to warn when the scheduler steps first;
    give the wrapped optimizer the same wrapper so the check keeps its meaning."""
    optimizer.step = private.track_scheduler_order(optimizer, optimizer.step)


def _op_name(reduce_op: Any) -> str:
    """'mean', 'avg', 'sum', ... or a torch.distributed ReduceOp, as one lower-case name."""
    if reduce_op is None:
        return "avg"
    name = reduce_op if isinstance(reduce_op, str) else str(reduce_op).rsplit(".", 1)[-1]
    name = name.lower()
    return "avg" if name == "mean" else name


def _no_groups(group: Optional[Any]) -> None:
    if group is not None and group is not torch.distributed.group.WORLD:
        raise ValueError("Horovod strategy: process sub-groups are not supported; unset `group`")


class HorovodEngine(Engine):
    """Horovod with this module's strategy; horovodrun starts its ranks."""

    name = "horovod"
    required_launcher = "horovodrun"

    def check_available(self) -> None:
        require()  # not installed: one line naming scripts/install_horovod.sh

    def check_launch(self, launcher: str, ranks: int) -> None:
        if launcher != "horovodrun" and ranks > 1:
            raise ConfigError("strategy", f"{{field}} horovod with {ranks} processes: horovodrun "
                              "starts Horovod's ranks, so drop the process and node counts and "
                              f"run `horovodrun -np {ranks} --gloo python trainup_gpu.py "
                              "--strategy horovod ...`")

    def strategy(self, share: Sharing, world_size: int, timeout=None, devices=None):
        # Also with one process: the run says what it would scale with.
        return HorovodStrategy(parallel_devices=devices)

    def strategy_name(self, world_size: int) -> str:
        return "horovod"

    def backend(self, share: Sharing, world_size: int) -> str:
        return "horovod"

    def backend_reason(self, share: Sharing, on_gpu: bool, ranks_on_host: int) -> str:
        return backend_reason(on_gpu, ranks_on_host)

    def shared_run_id(self, candidate: str) -> str:
        return shared_run_id(candidate)

    def shutdown(self) -> None:
        shutdown()  # the strategy keeps Horovod up between fit and test; this ends it
