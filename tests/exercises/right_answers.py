"""Right answers other than the references, written another way (another order of
operations, another library call, float64 where the reference is float32): a checker
must call each correct. test_mutants.py uses them to catch a checker made too strict."""


def answers(exercise):
    """(kind, name, body): the reference, the other right answers, the catalogue."""
    yield "right", "reference", exercise.reference
    for i, body in enumerate(RIGHT.get(exercise.id, [])):
        yield "right", f"right {i}", body
    for name, mistake in exercise.mistakes.items():
        yield "mistake", name, mistake.body


RIGHT = {
    "01.feature_counts": ['''
def feature_counts(levels):
    return 30 * levels + 18, 4 * levels + 4
'''],
    "01.normalise": ['''
import torch


def normalise(x):
    std = x.std(dim=0)  # over n - 1
    keep = std > 1e-6 * x.abs().mean(dim=0)
    return torch.where(keep, (x - x.mean(dim=0)) / torch.where(keep, std, 1.0), 0.0)
''', '''
import numpy as np
import torch


def normalise(x):
    a = x.numpy().astype(np.float64)
    std = a.std(axis=0)
    constant = std <= 1e-6 * np.abs(a).mean(axis=0)
    z = np.where(constant, 0.0, (a - a.mean(axis=0)) / np.where(constant, 1.0, std))
    return torch.from_numpy(z)
'''],
    "02.predict_wm2": ['''
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    model = LitMLP.load_from_checkpoint(checkpoint_path, map_location="cpu").eval()
    with torch.inference_mode():
        return model(x).clone()
'''],
    "02.optimizer_steps": ['''
def optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1):
    steps = 0
    for _ in range(epochs):
        batches = -(-n_train // batch_size)
        steps += -(-batches // accumulate_grad_batches)
    return steps
'''],
    "03.per_device_batch": ['''
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    ranks = num_nodes * devices_per_node
    per_rank, left = divmod(global_batch_size, ranks)
    if left or per_rank < 1:
        raise ValueError(f"{global_batch_size} columns do not split over {ranks} ranks")
    return per_rank
''', '''
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    gpus = num_nodes * devices_per_node  # a message naming the numbers only says why too
    if global_batch_size < gpus or global_batch_size % gpus:
        raise ValueError(f"{global_batch_size} columns over {gpus} GPUs")
    return global_batch_size // gpus
''', '''
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    world = num_nodes * devices_per_node
    if global_batch_size < world or global_batch_size % world:
        raise ValueError(f"--batch-size {global_batch_size} is not valid here")
    return global_batch_size // world
'''],
    "04.scaled_lr": ['''
import math


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    if rule == "linear":
        return base_lr * effective_batch_size / base_batch_size
    if rule == "sqrt":
        return base_lr * math.sqrt(effective_batch_size) / math.sqrt(base_batch_size)
    return base_lr
'''],
    "04.warmup_lr": ['''
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    t = 1.0 if warmup_steps == 0 else min(step, warmup_steps) / warmup_steps
    return base_lr * (1 - t) + target_lr * t
'''],
    "05.device_for": ['''
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    if machine == "none" or (machine == "offer" and not run_asks_gpu) or not visible_gpus:
        return "cpu"
    index = 0 if machine_index is None or machine_index not in range(visible_gpus) \\
        else machine_index
    return "cuda:%d" % index
'''],
    "05.memory_share": ['''
def memory_share(ranks_on_host, gpus_on_host):
    if not gpus_on_host:
        return "gloo", 1.0
    busiest = -(-ranks_on_host // gpus_on_host)
    return ("nccl" if busiest == 1 else "gloo"), 1 / busiest
'''],
    "06.port_holder": ['''
import psutil


def port_holder(port):
    for process in psutil.process_iter():
        try:
            sockets = process.net_connections(kind="tcp")
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
        if any(s.status == psutil.CONN_LISTEN and s.laddr.port == port for s in sockets):
            return process.pid
    return None
'''],
    "07.rank_arithmetic": ['''
def rank_of(node_rank, local_rank, devices_per_node):
    return local_rank + devices_per_node * node_rank


def place_of(rank, devices_per_node):
    return rank // devices_per_node, rank % devices_per_node
'''],
    "08.training_memory": ['''
import torch


def training_memory(model, batch_size):
    state = 4 * 4 * sum(p.numel() for p in model.parameters())
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    saved = linears[0].in_features + linears[-1].out_features
    width = linears[0].in_features
    for layer in model:
        width = layer.out_features if isinstance(layer, torch.nn.Linear) else width
        saved += width
    return state + 4 * batch_size * saved
'''],
    "08.bandwidths": ['''
def bandwidths(nbytes, seconds, world_size):
    return nbytes / seconds, nbytes * 2 * (world_size - 1) / (world_size * seconds)
'''],
    "metrics.padding": ['''
def padded_duplicates(n_samples, world_size):
    return (-n_samples) % world_size
'''],
    "04.noise_scale": ['''
import numpy as np


def noise_scale_parts(small_sq_norm, big_sq_norm, small_batch, big_batch):
    system = np.array([[1.0, 1.0 / small_batch], [1.0, 1.0 / big_batch]])
    g_sq, trace = np.linalg.solve(system, np.array([small_sq_norm, big_sq_norm]))
    return float(g_sq), float(trace)
'''],
    "09b.flat": ['''
import torch
import torch.distributed as dist


class FlatDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        for parameter in module.parameters():
            dist.broadcast(parameter.data, src=0)

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        world = dist.get_world_size()
        trainable = [p for p in self.module.parameters() if p.requires_grad]
        flat = torch.cat([p.grad.reshape(-1) / world for p in trainable])  # divide first
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in trainable:
            p.grad.copy_(flat[offset:offset + p.numel()].reshape(p.shape))
            offset += p.numel()
'''],
    "09b.overlap": ['''
import torch
import torch.distributed as dist


class OverlapDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        self.pending = []
        for parameter in module.parameters():
            dist.broadcast(parameter.data, src=0)
            if parameter.requires_grad:
                parameter.register_post_accumulate_grad_hook(self.reduce)

    def reduce(self, parameter):
        parameter.grad.div_(dist.get_world_size())  # as DDP does: divide, then sum
        self.pending.append(dist.all_reduce(parameter.grad, async_op=True))

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        torch.futures.wait_all([handle.get_future() for handle in self.pending])
        self.pending = []
'''],
    "09b.buckets": ['''
import torch
import torch.distributed as dist


class BucketDDP(torch.nn.Module):
    def __init__(self, module, bucket_cap_mb):
        super().__init__()
        self.module = module
        for parameter in module.parameters():
            dist.broadcast(parameter.data, src=0)
        limit = bucket_cap_mb * 2 ** 20
        self.buckets = [[]]
        for parameter in reversed(list(module.parameters())):
            if not parameter.requires_grad:
                continue
            if sum(p.numel() * p.element_size() for p in self.buckets[-1]) >= limit:
                self.buckets.append([])
            self.buckets[-1].append(parameter)
            parameter.register_post_accumulate_grad_hook(self.ready)
        self.ready_ids = set()
        self.launched = []

    def ready(self, parameter):
        self.ready_ids.add(id(parameter))
        for bucket in self.buckets:
            mine = any(p is parameter for p in bucket)  # `in` would compare values
            if mine and all(id(p) in self.ready_ids for p in bucket):
                flat = torch.cat([p.grad.view(-1) for p in bucket])
                flat /= dist.get_world_size()
                self.launched.append((bucket, flat, dist.all_reduce(flat, async_op=True)))

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        for bucket, flat, handle in self.launched:
            handle.wait()
            for p, part in zip(bucket, torch.split(flat, [p.numel() for p in bucket])):
                p.grad.copy_(part.view_as(p.grad))
        self.launched, self.ready_ids = [], set()
'''],
    "11.row_parallel": ['''
import torch
import torch.distributed as dist


def row_parallel_forward(h_local, weight_local, bias):
    out = torch.nn.functional.linear(h_local, weight_local)
    if dist.get_rank() == 0:
        out = out + bias  # one rank adds it: the sum holds it once
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out
''', '''
import torch.distributed as dist


def row_parallel_forward(h_local, weight_local, bias):  # a share of the bias on each rank
    partial = h_local @ weight_local.T + bias / dist.get_world_size()
    dist.all_reduce(partial)
    return partial
'''],
    "09.buckets": ['''
def ddp_buckets(grad_bytes, first_cap, cap):
    buckets, start = [], 0
    while start < len(grad_bytes):
        limit, size, end = (first_cap if not buckets else cap), 0, start
        while end < len(grad_bytes) and size < limit:
            size += grad_bytes[end]
            end += 1
        buckets.append(list(range(start, end)))
        start = end
    return buckets
'''],
    "10.stragglers": ['''
import numpy as np


def stragglers(busy_ms, wait_ms):
    busy = np.array(busy_ms, dtype=float)
    flagged = []
    for rank in range(len(busy)):
        typical = float(np.median(np.delete(busy, rank)))
        if busy[rank] > 1.3 * typical and busy[rank] - typical >= 2.0:
            flagged.append(rank)
    return flagged
'''],
    "11.accumulate": ['''
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    optimizer.zero_grad(set_to_none=True)
    for rows in torch.arange(len(x)).tensor_split(micro_batches):
        part = torch.nn.functional.mse_loss(model(x[rows]), y[rows], reduction="sum")
        (part / (len(x) * y.shape[1])).backward()
    optimizer.step()
'''],
    "03.average_gradients": ['''
import torch.distributed as dist


def average_gradients(model):
    for parameter in model.parameters():
        parameter.grad /= dist.get_world_size()
        dist.all_reduce(parameter.grad)
''', '''
import os

import torch.distributed as dist


def average_gradients(model):  # the world size as torchrun and Lightning export it
    world_size = int(os.environ["WORLD_SIZE"])
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
        parameter.grad /= world_size
'''],
    "metrics.exact_val_loss": ['''
import torch
import torch.distributed as dist


def exact_val_loss(losses):
    total = losses.double().sum()
    count = torch.tensor(float(len(losses)), dtype=torch.float64)
    dist.all_reduce(total)
    dist.all_reduce(count)
    return float(total / count)
''', '''
import torch.distributed as dist


def exact_val_loss(losses):  # two numbers a rank, gathered as torchmetrics syncs its states
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(object_list=gathered,
                           obj=(float(losses.double().sum()), losses.numel()))
    return sum(total for total, _ in gathered) / sum(count for _, count in gathered)
''', '''
import torch
import torch.distributed as dist


def exact_val_loss(losses):  # a row per rank, all_reduced: shorter than the split
    rows = torch.zeros(dist.get_world_size(), 2, dtype=torch.float64)
    rows[dist.get_rank()] = torch.stack([losses.double().sum(),
                                         torch.tensor(float(losses.numel()))])
    dist.all_reduce(rows)
    return float(rows[:, 0].sum() / rows[:, 1].sum())
'''],
    "09.ring_all_reduce": ['''
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(tensor.view(-1), n)
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(n - 1):
            if phase == "reduce-scatter":
                out, into = (rank - step) % n, (rank - step - 1) % n
            else:
                out, into = (rank + 1 - step) % n, (rank - step) % n
            received = torch.empty_like(chunks[into])
            if rank % 2 == 0:  # even ranks send first: no deadlock with blocking calls
                dist.send(chunks[out].clone(), (rank + 1) % n)
                dist.recv(received, (rank - 1) % n)
            else:
                dist.recv(received, (rank - 1) % n)
                dist.send(chunks[out].clone(), (rank + 1) % n)
            if phase == "reduce-scatter":
                chunks[into].add_(received)
            else:
                chunks[into].copy_(received)
    return tensor
'''],
    "10.sum_stats": ['''
import torch
import torch.distributed as dist


def sum_stats(stats):
    result = {}
    for name in sorted(stats):
        value = torch.tensor([stats[name]], dtype=torch.float32)
        dist.all_reduce(value)
        result[name] = value.item()
    return result
'''],
    "11.zero1_step": ['''
import torch
import torch.distributed as dist


def zero1_step(params, state, lr):
    rank, world = dist.get_rank(), dist.get_world_size()
    for index, param in enumerate(params):
        if index % world == rank:
            if index not in state:
                state[index] = torch.zeros_like(param)
            state[index] = 0.9 * state[index] + param.grad
            param.data -= lr * state[index]
    for index, param in enumerate(params):
        dist.broadcast(param.data, src=index % world)
''', '''
import torch
import torch.distributed as dist


def zero1_step(params, state, lr):  # every broadcast launched at once, then all waited on
    rank, world = dist.get_rank(), dist.get_world_size()
    with torch.no_grad():
        for index in range(rank, len(params), world):
            buf = state.setdefault(index, torch.zeros_like(params[index]))
            buf.mul_(0.9).add_(params[index].grad)
            params[index].sub_(lr * buf)
        handles = [dist.broadcast(p, src=i % world, async_op=True) for i, p in enumerate(params)]
        for handle in handles:
            handle.wait()
''', '''
import torch
import torch.distributed as dist


def zero1_step(params, state, lr):  # the buffers keyed by the parameter, not its index
    rank, world_size = dist.get_rank(), dist.get_world_size()
    with torch.no_grad():
        for index, param in enumerate(params):
            owner = index % world_size
            if owner == rank:
                buf = state.setdefault(id(param), torch.zeros_like(param))
                buf.mul_(0.9).add_(param.grad)
                param.sub_(lr * buf)
            dist.broadcast(param, src=owner)
'''],
    "12.step_time": ['''
def predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s):
    bytes_per_s = rate_bits / 8
    exchange = 0.0 if hosts < 2 else 2 * (hosts - 1) * (latency_s + gradient_bytes / hosts / bytes_per_s)
    return compute_s + exchange
'''],
    "12.pick_interface": ['''
import ipaddress


def pick_interface(interfaces, master_addr):
    target = ipaddress.ip_address(master_addr)
    candidates = [(ipaddress.ip_interface(a).network.prefixlen, -order, name)
                  for order, (name, addresses) in enumerate(interfaces.items())
                  for a in addresses if target in ipaddress.ip_interface(a).network]
    return max(candidates)[2] if candidates else None  # a tie: the first given
'''],
    "08b.sample_limit": ['''
def sample_limit(n_x, hidden, n_y, bandwidth, peak_flops):
    widths = [n_x] + list(hidden) + [n_y]
    macs = [a * b for a, b in zip(widths, widths[1:])]
    flop = 2 * sum(macs) + 2 * sum(macs) + 2 * sum(macs[1:])  # forward, weights, inputs
    rates = {"memory": bandwidth / (4.0 * (n_x + n_y)), "compute": peak_flops / flop}
    bound = min(rates, key=rates.get)
    return rates[bound], bound
'''],
}
