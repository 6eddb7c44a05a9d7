"""Wrong answers written after the checkers were finished, as a learner would write them,
without reading the catalogues: none of them is in a catalogue, and every one must be
rejected (wrong, or an error that names the line) with a message longer than "wrong"."""
from __future__ import annotations

import pytest

from kosmoss.exercises.core import ERROR, WRONG, find
from kosmoss.exercises.judging import judge_sources

FRESH = [
    ("01.feature_counts", "136 interfaces hard-coded", '''
def feature_counts(levels):
    return 17 + 27 * levels + 2 * (levels + 1) + 136, 4 * (levels + 1)
''', "yours grows by 29 per level"),
    ("01.feature_counts", "targets off by a few", '''
def feature_counts(levels):
    return 17 + 27 * levels + 2 * (levels + 1) + (levels - 1), 4 * levels + 1
''', "4 fluxes on each half level"),
    ("01.normalise", "NaN turned into 0 afterwards", '''
import torch


def normalise(x):
    return torch.nan_to_num((x - x.mean(0)) / x.std(0))
''', "a test for std == 0 (or below an absolute cut) misses it"),
    ("01.normalise", "min-max scaling", '''
import torch


def normalise(x):
    low, high = x.min(0).values, x.max(0).values
    span = torch.where(high > low, high - low, torch.ones_like(high))
    return (x - low) / span
'''),
    ("01.normalise", "one mean for the whole batch", '''
import torch


def normalise(x):
    std = x.std(0)
    keep = std > 1e-6 * x.abs().mean(0)
    return torch.where(keep, (x - x.mean()) / torch.where(keep, std, 1.0), 0.0)
'''),
    ("02.predict_wm2", "the bare network", '''
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    with torch.no_grad():
        return LitMLP.load_from_checkpoint(checkpoint_path).net(x)
''', "are the checkpoint's weights and statistics loaded?"),
    ("02.predict_wm2", "predict_step", '''
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    return LitMLP.load_from_checkpoint(checkpoint_path).predict_step(x, 0)
''', "track gradients (requires_grad)"),
    ("02.optimizer_steps", "one formula for everything", '''
import math


def optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1):
    return math.ceil(n_train * epochs / (batch_size * accumulate_grad_batches))
'''),
    ("02.optimizer_steps", "plus one for the last batch", '''
def optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1):
    return (n_train // batch_size + 1) * epochs // accumulate_grad_batches
'''),
    ("03.per_device_batch", "each factor divides", '''
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    if global_batch_size % num_nodes or global_batch_size % devices_per_node:
        raise ValueError("does not divide")
    return global_batch_size // (num_nodes * devices_per_node)
''', "is not divisible by the world size 4"),
    ("03.per_device_batch", "rounded", '''
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    return round(global_batch_size / (num_nodes * devices_per_node))
''', "is not divisible by the world size 4"),
    ("04.scaled_lr", "operator precedence in the square root", '''
def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    k = effective_batch_size / base_batch_size
    if rule == "sqrt":
        return base_lr * k ** 1 / 2
    return base_lr * k if rule == "linear" else base_lr
''', "k ** 1 / 2 is (k ** 1) / 2"),
    ("04.noise_scale", "square roots of the norms", '''
import math


def noise_scale_parts(small_sq_norm, big_sq_norm, small_batch, big_batch):
    small, big = math.sqrt(small_sq_norm), math.sqrt(big_sq_norm)
    g_sq = (big_batch * big - small_batch * small) / (big_batch - small_batch)
    return g_sq, (small - big) / (1 / small_batch - 1 / big_batch)
'''),
    ("04.noise_scale", "the two norms taken the other way round", '''
def noise_scale_parts(small_sq_norm, big_sq_norm, small_batch, big_batch):
    g_sq = (big_batch * small_sq_norm - small_batch * big_sq_norm) / (big_batch - small_batch)
    trace = (big_sq_norm - small_sq_norm) / (1 / small_batch - 1 / big_batch)
    return g_sq, trace
''', "the two squared norms taken the other way round"),
    ("04.noise_scale", "a dict", '''
def noise_scale_parts(small_sq_norm, big_sq_norm, small_batch, big_batch):
    trace = (small_sq_norm - big_sq_norm) / (1 / small_batch - 1 / big_batch)
    return {"g_sq": big_sq_norm - trace / big_batch, "trace": trace}
''', "a pair (g_sq, trace) of numbers"),
    ("04.warmup_lr", "step + 1", '''
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    if step >= warmup_steps:
        return target_lr
    return base_lr + (target_lr - base_lr) * (step + 1) / warmup_steps
'''),
    ("04.warmup_lr", "min of the ramp", '''
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    return min(target_lr, base_lr + (target_lr - base_lr) * step / warmup_steps)
''', "raised ZeroDivisionError"),
    ("05.device_for", "no index in the name", '''
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    wants = machine == "force" or (machine == "offer" and run_asks_gpu)
    return "cuda" if wants and visible_gpus else "cpu"
''', "an index that does not exist means GPU 0"),
    ("05.device_for", "force ignores what is visible", '''
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    if machine == "force":
        return f"cuda:{machine_index or 0}"
    if machine == "offer" and run_asks_gpu and visible_gpus:
        index = machine_index or 0
        return f"cuda:{index if index < visible_gpus else 0}"
    return "cpu"
''', "an index that does not exist means GPU 0"),
    ("05.memory_share", "gloo as soon as several ranks", '''
import math


def memory_share(ranks_on_host, gpus_on_host):
    if gpus_on_host == 0:
        return "gloo", 1.0
    backend = "nccl" if ranks_on_host == 1 else "gloo"
    return backend, 1.0 / math.ceil(ranks_on_host / gpus_on_host)
''', "one rank per GPU: NCCL"),
    ("05.memory_share", "a share above one", '''
def memory_share(ranks_on_host, gpus_on_host):
    if gpus_on_host == 0:
        return "gloo", 1.0
    backend = "nccl" if ranks_on_host <= gpus_on_host else "gloo"
    return backend, gpus_on_host / ranks_on_host
''', "ranks over GPUs, rounded up"),
    ("06.port_holder", "compares with a string", '''
import psutil


def port_holder(port):
    for c in psutil.net_connections():
        if c.status == "LISTEN" and c.laddr[1] == str(port):
            return c.pid
    return None
''', "compare the port with each socket's local address (laddr)"),
    ("06.port_holder", "looks in the command lines", '''
import psutil


def port_holder(port):
    for process in psutil.process_iter(["pid", "cmdline"]):
        if str(port) in " ".join(process.info["cmdline"] or []):
            return process.info["pid"]
    return None
''', "compare the port with each socket's local address (laddr)"),
    ("07.rank_arithmetic", "devices per node minus one", '''
def rank_of(node_rank, local_rank, devices_per_node):
    return node_rank * (devices_per_node - 1) + local_rank


def place_of(rank, devices_per_node):
    return rank // devices_per_node, rank % devices_per_node
'''),
    ("07.rank_arithmetic", "place from rank - 1", '''
def rank_of(node_rank, local_rank, devices_per_node):
    return node_rank * devices_per_node + local_rank


def place_of(rank, devices_per_node):
    return (rank - 1) // devices_per_node, rank % devices_per_node
''', "node_rank = rank // devices_per_node"),
    ("08.training_memory", "forgets the input batch", '''
from torch import nn


def training_memory(model, batch_size):
    params = sum(p.numel() for p in model.parameters())
    outputs = 0
    width = None
    for layer in model:
        if isinstance(layer, nn.Linear):
            width = layer.out_features
        outputs += width
    return 16 * params + 4 * batch_size * (outputs + width)
''', "or the input batch"),
    ("08.training_memory", "megabytes, not bytes", '''
from torch import nn


def training_memory(model, batch_size):
    params = sum(p.numel() for p in model.parameters())
    linears = [m for m in model if isinstance(m, nn.Linear)]
    width = linears[0].in_features + linears[-1].out_features
    features = linears[0].in_features
    for layer in model:
        features = layer.out_features if isinstance(layer, nn.Linear) else features
        width += features
    return (16 * params + 4 * batch_size * width) / 1e6
''', "that is the measurement in MB"),
    ("08.bandwidths", "GB/s", '''
def bandwidths(nbytes, seconds, world_size):
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (world_size - 1) / world_size
''', "algbw is the buffer's bytes over the seconds"),
    ("08.bandwidths", "time over size", '''
def bandwidths(nbytes, seconds, world_size):
    algbw = seconds / nbytes
    return algbw, algbw * 2 * (world_size - 1) / world_size
''', "algbw is the buffer's bytes over the seconds"),
    ("metrics.padding", "per-rank difference", '''
import math


def padded_duplicates(n_samples, world_size):
    return math.ceil(n_samples / world_size) - n_samples // world_size
''', "as many repeats as it takes to give every rank the same count"),
    ("09.buckets", "elements, not bytes", '''
def ddp_buckets(grad_bytes, first_cap, cap):
    buckets, current, size, limit = [], [], 0, first_cap
    for index, nbytes in enumerate(grad_bytes):
        current.append(index)
        size += nbytes // 4
        if size >= limit:
            buckets.append(current)
            current, size, limit = [], 0, cap
    if current:
        buckets.append(current)
    return buckets
''', "not divided by a float32's 4 bytes"),
    ("09.buckets", "bucket sizes, not indices", '''
def ddp_buckets(grad_bytes, first_cap, cap):
    buckets, current, limit = [], [], first_cap
    for nbytes in grad_bytes:
        current.append(nbytes)
        if sum(current) >= limit:
            buckets.append(current)
            current, limit = [], cap
    if current:
        buckets.append(current)
    return buckets
''', "return indices into grad_bytes"),
    ("10.stragglers", "always the busiest", '''
def stragglers(busy_ms, wait_ms):
    return [busy_ms.index(max(busy_ms))]
''', "flags nobody"),
    ("10.stragglers", "the one that waits least", '''
def stragglers(busy_ms, wait_ms):
    return [wait_ms.index(min(wait_ms))]
''', "flags nobody"),
    ("11.accumulate", "split by size", '''
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    optimizer.zero_grad()
    size = len(x) // micro_batches
    for x_part, y_part in zip(x.split(size), y.split(size)):
        (torch.nn.functional.mse_loss(model(x_part), y_part) / micro_batches).backward()
    optimizer.step()
''', "as equal as tensor_split makes them"),
    ("11.accumulate", "no step", '''
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    optimizer.zero_grad()
    for x_part, y_part in zip(x.tensor_split(micro_batches), y.tensor_split(micro_batches)):
        loss = torch.nn.functional.mse_loss(model(x_part), y_part) * len(x_part) / len(x)
        loss.backward()
''', "optimizer.step ran 0 times"),
    ("01.normalise", "constant up to float32 epsilon", '''
import torch


def normalise(x):
    std = x.std(dim=0, correction=0)
    constant = std <= torch.finfo(x.dtype).eps * x.abs().mean(dim=0)
    scaled = (x - x.mean(dim=0)) / torch.where(constant, torch.ones_like(std), std)
    return torch.where(constant, torch.zeros_like(scaled), scaled)
''', "not float32's epsilon"),
    ("04.noise_scale", "trace clamped at zero", '''
def noise_scale_parts(small_sq_norm, big_sq_norm, small_batch, big_batch):
    trace = max(0.0, (small_sq_norm - big_sq_norm) / (1 / small_batch - 1 / big_batch))
    g_sq = big_sq_norm - trace / big_batch
    return g_sq, trace
''', "keep it, as a negative |G|²"),
    ("06.port_holder", "any TCP socket on that port, listening or not", '''
import psutil


def port_holder(port):
    for c in psutil.net_connections(kind="tcp"):
        if c.laddr and c.laddr.port == port:
            return c.pid
    return None
''', "only a socket in the LISTEN state holds MASTER_PORT"),
    ("08.training_memory", "two outputs per hidden layer, the MLP's shape assumed", '''
from torch import nn


def training_memory(model, batch_size):
    params = sum(p.numel() for p in model.parameters())
    linears = [m for m in model if isinstance(m, nn.Linear)]
    hidden = sum(m.out_features for m in linears[:-1])
    width = linears[0].in_features + 2 * hidden + 2 * linears[-1].out_features
    return 4 * (4 * params + batch_size * width)
''', "short by the output of the last layer, an activation"),
    ("08.training_memory", "in and out features of every Linear", '''
from torch import nn


def training_memory(model, batch_size):
    params = sum(p.numel() for p in model.parameters())
    linears = [m for m in model if isinstance(m, nn.Linear)]
    width = sum(m.in_features + m.out_features for m in linears) + linears[-1].out_features
    return 4 * (4 * params + batch_size * width)
''', "short by the output of the last layer, an activation"),
    ("08b.sample_limit", "the last layer's input gradient skipped, not the first's", '''
def sample_limit(n_x, hidden, n_y, bandwidth, peak_flops):
    sizes = [n_x, *hidden, n_y]
    layers = list(zip(sizes[:-1], sizes[1:]))
    forward = sum(2 * i * o for i, o in layers)
    backward = forward + sum(2 * i * o for i, o in layers[:-1])
    by_memory = bandwidth / (4 * (n_x + n_y))
    by_compute = peak_flops / (forward + backward)
    return (by_memory, "memory") if by_memory <= by_compute else (by_compute, "compute")
''', "it is the first layer's input (the data) that needs no gradient"),
    ("10.stragglers", "compared with the fastest other rank", '''
def stragglers(busy_ms, wait_ms):
    slow = []
    for rank, mine in enumerate(busy_ms):
        fastest = min(busy_ms[:rank] + busy_ms[rank + 1:])
        if mine > fastest * 1.3 and mine - fastest >= 2:
            slow.append(rank)
    return slow
''', "not the fastest of them"),
    ("10.stragglers", "median by hand, the upper middle", '''
def stragglers(busy_ms, wait_ms):
    slow = []
    for rank, mine in enumerate(busy_ms):
        others = sorted(busy_ms[:rank] + busy_ms[rank + 1:])
        typical = others[len(others) // 2]
        if mine > typical * 1.3 and mine - typical >= 2:
            slow.append(rank)
    return slow
''', "not the upper one"),
    ("10.stragglers", "median by hand, the lower middle", '''
def stragglers(busy_ms, wait_ms):
    slow = []
    for rank, mine in enumerate(busy_ms):
        others = sorted(busy_ms[:rank] + busy_ms[rank + 1:])
        typical = others[(len(others) - 1) // 2]
        if mine > typical * 1.3 and mine - typical >= 2:
            slow.append(rank)
    return slow
''', "not the lower one"),
    ("12.pick_interface", "most leading octets in common", '''
def pick_interface(interfaces, master_addr):
    def common(address):
        n = 0
        for a, b in zip(address.split("/")[0].split("."), master_addr.split(".")):
            if a != b:
                break
            n += 1
        return n
    scored = [(common(a), name) for name, addresses in interfaces.items() for a in addresses]
    scored = [s for s in scored if s[0] > 0]
    return max(scored)[1] if scored else None
'''),
    ("04.warmup_lr", "base_lr without warm-up", '''
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    if warmup_steps == 0:
        return base_lr
    if step >= warmup_steps:
        return target_lr
    return base_lr + (target_lr - base_lr) * step / warmup_steps
''', "with warmup_steps 0 there is no warm-up"),
    ("01.normalise", "strict test misses the zero column", '''
import torch


def normalise(x):
    std = x.std(dim=0, correction=0)
    constant = std < 1e-6 * x.abs().mean(dim=0)
    scaled = (x - x.mean(dim=0)) / torch.where(constant, torch.ones_like(std), std)
    return torch.where(constant, torch.zeros_like(scaled), scaled)
''', "a constant feature must become 0"),
    ("02.optimizer_steps", "quotient plus remainder", '''
import math


def optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1):
    batches = math.ceil(n_train / batch_size)
    q, r = divmod(batches, accumulate_grad_batches)
    return (q + r) * epochs
'''),
    ("03.per_device_batch", "refuses a batch equal to the world", '''
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    world = num_nodes * devices_per_node
    if global_batch_size <= world or global_batch_size % world:
        raise ValueError(f"{global_batch_size} does not split over {world} ranks")
    return global_batch_size // world
''', "but it splits evenly"),
    ("04.scaled_lr", "sqrt of the base only", '''
import math


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    if rule == "sqrt":
        return base_lr * effective_batch_size / math.sqrt(base_batch_size)
    if rule == "linear":
        return base_lr * effective_batch_size / base_batch_size
    return base_lr
'''),
    ("04.warmup_lr", "ramp over warmup_steps + 1", '''
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    if step >= warmup_steps:
        return target_lr
    return base_lr + (target_lr - base_lr) * step / (warmup_steps + 1)
'''),
    ("05.device_for", "index modulo the GPUs", '''
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    wants = machine == "force" or (machine == "offer" and run_asks_gpu)
    if not wants or not visible_gpus:
        return "cpu"
    return f"cuda:{(machine_index or 0) % visible_gpus}"
'''),
    ("05.memory_share", "round, not ceil", '''
def memory_share(ranks_on_host, gpus_on_host):
    if not gpus_on_host:
        return "gloo", 1.0
    if ranks_on_host <= gpus_on_host:
        return "nccl", 1.0
    return "gloo", 1.0 / round(ranks_on_host / gpus_on_host)
''', "ranks over GPUs, rounded up"),
    ("08.bandwidths", "one rank taken as two", '''
def bandwidths(nbytes, seconds, world_size):
    algbw = nbytes / seconds
    n = max(world_size, 2)
    return algbw, algbw * 2 * (n - 1) / n
''', "2(n-1)/n of the buffer per rank"),
    ("09.buckets", "a big gradient in a bucket of its own", '''
def ddp_buckets(grad_bytes, first_cap, cap):
    buckets, current, size, limit = [], [], 0, first_cap
    for index, nbytes in enumerate(grad_bytes):
        if nbytes >= limit and current:
            buckets.append(current)
            current, size, limit = [], 0, cap
        current.append(index)
        size += nbytes
        if size >= limit:
            buckets.append(current)
            current, size, limit = [], 0, cap
    if current:
        buckets.append(current)
    return buckets
''', "with the gradient that made it go over inside"),
    ("12.step_time", "latency once per phase", '''
def predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s):
    if hosts == 1:
        return compute_s
    steps = 2 * (hosts - 1)
    return compute_s + 2 * latency_s + steps / hosts * gradient_bytes * 8 / rate_bits
'''),
    # Third round: each entry also names a fragment its verdict must hold.
    ("12.pick_interface", "whole octets of the prefix compared", '''
def pick_interface(interfaces, master_addr):
    best, best_prefix = None, -1
    target = master_addr.split(".")
    for name, addresses in interfaces.items():
        for address in addresses:
            ip, prefix = address.split("/")
            octets = int(prefix) // 8
            if ip.split(".")[:octets] == target[:octets] and int(prefix) > best_prefix:
                best, best_prefix = name, int(prefix)
    return best
''', "no whole number of octets"),
    ("12.pick_interface", "whole octets, rounded up", '''
import math


def pick_interface(interfaces, master_addr):
    best, best_prefix = None, -1
    target = master_addr.split(".")
    for name, addresses in interfaces.items():
        for address in addresses:
            ip, prefix = address.split("/")
            octets = math.ceil(int(prefix) / 8)
            if ip.split(".")[:octets] == target[:octets] and int(prefix) > best_prefix:
                best, best_prefix = name, int(prefix)
    return best
''', "no whole number of octets"),
    ("07.rank_arithmetic", "the node only", '''
def rank_of(node_rank, local_rank, devices_per_node):
    return node_rank * devices_per_node + local_rank


def place_of(rank, devices_per_node):
    return rank // devices_per_node
''', "return a pair (node_rank, local_rank)"),
    ("08b.sample_limit", "the rate without its bound", '''
def sample_limit(n_x, hidden, n_y, bandwidth, peak_flops):
    sizes = [n_x, *hidden, n_y]
    layers = list(zip(sizes[:-1], sizes[1:]))
    forward = sum(2 * i * o for i, o in layers)
    backward = forward + sum(2 * i * o for i, o in layers[1:])
    return min(bandwidth / (4 * (n_x + n_y)), peak_flops / (forward + backward))
''', "return (samples_per_s, bound)"),
    ("10.stragglers", "the median of the others, one rank left unguarded", '''
import statistics


def stragglers(busy_ms, wait_ms):
    slow = []
    for rank, mine in enumerate(busy_ms):
        others = statistics.median(busy_ms[:rank] + busy_ms[rank + 1:])
        if mine > others * 1.3 and mine - others >= 2:
            slow.append(rank)
    return slow
''', "a rank alone holds back nobody"),
    ("06.port_holder", "the connections listed once, on the first call", '''
import psutil

_connections = []


def port_holder(port):
    if not _connections:  # psutil walks every process: list them once
        _connections.extend(psutil.net_connections(kind="tcp"))
    for c in _connections:
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN:
            return c.pid
    return None
''', "ask psutil on every call"),
    ("06.port_holder", "IPv4 listeners only", '''
import psutil


def port_holder(port):
    for c in psutil.net_connections(kind="tcp4"):
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN:
            return c.pid
    return None
''', "not 'tcp4'"),
    ("12.step_time", "latency once per host", '''
def predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s):
    if hosts == 1:
        return compute_s
    steps = 2 * (hosts - 1)
    return compute_s + hosts * latency_s + steps / hosts * gradient_bytes * 8 / rate_bits
''', "the α–β model's"),
    # Fourth round. Told correct before: a graph built and then detached, the slices' losses
    # summed before one backward, one rank on a host without a GPU, the loopback's name.
    ("02.predict_wm2", "detached afterwards, not computed under no_grad", '''
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    model = LitMLP.load_from_checkpoint(checkpoint_path, map_location="cpu").eval()
    return model(x).detach()
''', ".detach() afterwards"),
    ("11.accumulate", "the slices' losses summed, one backward at the end", '''
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    optimizer.zero_grad()
    total = 0
    for x_part, y_part in zip(x.tensor_split(micro_batches), y.tensor_split(micro_batches)):
        total = total + torch.nn.functional.mse_loss(model(x_part), y_part) * len(x_part) / len(x)
    total.backward()
    optimizer.step()
''', "ran before the backward of slice 1"),
    ("11.accumulate", "the losses kept, each one's backward after the loop", '''
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    optimizer.zero_grad()
    losses = []
    for x_part, y_part in zip(x.tensor_split(micro_batches), y.tensor_split(micro_batches)):
        losses.append(torch.nn.functional.mse_loss(model(x_part), y_part) * len(x_part) / len(x))
    for loss in losses:
        loss.backward()
    optimizer.step()
''', "in memory at once"),
    ("05.memory_share", "no GPU taken as one, not to divide by zero", '''
def memory_share(ranks_on_host, gpus_on_host):
    busiest = -(-ranks_on_host // max(gpus_on_host, 1))
    backend = "nccl" if busiest == 1 else "gloo"
    return backend, (1.0 / busiest if gpus_on_host else 1.0)
''', "1 rank(s) on 0 GPU(s)"),
    ("12.pick_interface", "the loopback's name hard-coded", '''
import ipaddress


def pick_interface(interfaces, master_addr):
    target = ipaddress.ip_address(master_addr)
    if target.is_loopback:
        return "lo"
    best, best_prefix = None, -1
    for name, addresses in interfaces.items():
        for address in addresses:
            network = ipaddress.ip_interface(address).network
            if target in network and network.prefixlen > best_prefix:
                best, best_prefix = name, network.prefixlen
    return best
''', "no interface of this host"),
    # Fourth round, rejected already: kept so that they stay rejected.
    ("08b.sample_limit", "biases counted", '''
def sample_limit(n_x, hidden, n_y, bandwidth, peak_flops):
    sizes = [n_x, *hidden, n_y]
    layers = list(zip(sizes[:-1], sizes[1:]))
    forward = sum(2 * i * o + o for i, o in layers)
    backward = forward + sum(2 * i * o for i, o in layers[1:])
    by_memory = bandwidth / (4 * (n_x + n_y))
    by_compute = peak_flops / (forward + backward)
    return (by_memory, "memory") if by_memory <= by_compute else (by_compute, "compute")
'''),
    ("08b.sample_limit", "floor division of the rates", '''
def sample_limit(n_x, hidden, n_y, bandwidth, peak_flops):
    sizes = [n_x, *hidden, n_y]
    layers = list(zip(sizes[:-1], sizes[1:]))
    forward = sum(2 * i * o for i, o in layers)
    backward = forward + sum(2 * i * o for i, o in layers[1:])
    by_memory = bandwidth // (4 * (n_x + n_y))
    by_compute = peak_flops // (forward + backward)
    return (by_memory, "memory") if by_memory <= by_compute else (by_compute, "compute")
''', "divide with /, not //"),
    ("08b.sample_limit", "input gradients from the second hidden layer on", '''
def sample_limit(n_x, hidden, n_y, bandwidth, peak_flops):
    sizes = [n_x, *hidden, n_y]
    layers = list(zip(sizes[:-1], sizes[1:]))
    forward = sum(2 * i * o for i, o in layers)
    backward = forward + sum(2 * i * o for i, o in layers[2:])
    by_memory = bandwidth / (4 * (n_x + n_y))
    by_compute = peak_flops / (forward + backward)
    return (by_memory, "memory") if by_memory <= by_compute else (by_compute, "compute")
'''),
    ("08b.sample_limit", "the weights read with every sample", '''
def sample_limit(n_x, hidden, n_y, bandwidth, peak_flops):
    sizes = [n_x, *hidden, n_y]
    layers = list(zip(sizes[:-1], sizes[1:]))
    forward = sum(2 * i * o for i, o in layers)
    backward = forward + sum(2 * i * o for i, o in layers[1:])
    by_memory = bandwidth / (4 * (n_x + n_y + sum(i * o for i, o in layers)))
    by_compute = peak_flops / (forward + backward)
    return (by_memory, "memory") if by_memory <= by_compute else (by_compute, "compute")
'''),
    ("08b.sample_limit", "seconds per sample, not samples per second", '''
def sample_limit(n_x, hidden, n_y, bandwidth, peak_flops):
    sizes = [n_x, *hidden, n_y]
    layers = list(zip(sizes[:-1], sizes[1:]))
    flop = sum(4 * i * o for i, o in layers) + sum(2 * i * o for i, o in layers[1:])
    t_memory = 4 * (n_x + n_y) / bandwidth
    t_compute = flop / peak_flops
    return (t_memory, "memory") if t_memory >= t_compute else (t_compute, "compute")
'''),
    ("metrics.padding", "ceil as round(n / w + 0.5)", '''
def padded_duplicates(n_samples, world_size):
    return round(n_samples / world_size + 0.5) * world_size - n_samples
''', "when the split divides evenly there is no padding"),
    ("metrics.padding", "no more repeats than samples", '''
import math


def padded_duplicates(n_samples, world_size):
    return min(math.ceil(n_samples / world_size) * world_size - n_samples, n_samples)
''', "the padding fills the last round up to the world size"),
    ("metrics.padding", "the per-rank gap times the world", '''
import math


def padded_duplicates(n_samples, world_size):
    return world_size * (math.ceil(n_samples / world_size) - n_samples // world_size)
'''),
    ("metrics.padding", "the remainder unless the split is smaller than the world", '''
def padded_duplicates(n_samples, world_size):
    if n_samples < world_size:
        return world_size - n_samples
    return n_samples % world_size
''', "the padding fills the last round up to the world size"),
    ("07.rank_arithmetic", "round, not floor", '''
def rank_of(node_rank, local_rank, devices_per_node):
    return node_rank * devices_per_node + local_rank


def place_of(rank, devices_per_node):
    return round(rank / devices_per_node), rank % devices_per_node
''', "node_rank = rank // devices_per_node"),
    ("07.rank_arithmetic", "nodes counted from 1", '''
def rank_of(node_rank, local_rank, devices_per_node):
    return (node_rank - 1) * devices_per_node + local_rank


def place_of(rank, devices_per_node):
    return rank // devices_per_node + 1, rank % devices_per_node
'''),
    ("07.rank_arithmetic", "local rank from devices per node minus one", '''
def rank_of(node_rank, local_rank, devices_per_node):
    return node_rank * devices_per_node + local_rank


def place_of(rank, devices_per_node):
    node = rank // devices_per_node
    return node, rank - node * (devices_per_node - 1)
''', "node_rank = rank // devices_per_node"),
    ("07.rank_arithmetic", "a dict, not a pair", '''
def rank_of(node_rank, local_rank, devices_per_node):
    return node_rank * devices_per_node + local_rank


def place_of(rank, devices_per_node):
    return {"node_rank": rank // devices_per_node, "local_rank": rank % devices_per_node}
''', "ranks are integers"),
    ("02.predict_wm2", "de-normalised twice", '''
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    model = LitMLP.load_from_checkpoint(checkpoint_path).eval()
    with torch.no_grad():
        return model.denormalize_y(model(x))
''', "are the checkpoint's weights and statistics loaded?"),
    ("12.step_time", "floor division of the steps by the hosts", '''
def predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s):
    if hosts == 1:
        return compute_s
    steps = 2 * (hosts - 1)
    return compute_s + steps * latency_s + steps // hosts * gradient_bytes * 8 / rate_bits
''', "the whole buffer over the link"),
    ("12.step_time", "latency of one phase's steps", '''
def predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s):
    if hosts == 1:
        return compute_s
    steps = 2 * (hosts - 1)
    return compute_s + (hosts - 1) * latency_s + steps / hosts * gradient_bytes * 8 / rate_bits
'''),
    ("12.step_time", "both directions add up to twice the rate", '''
def predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s):
    if hosts == 1:
        return compute_s
    steps = 2 * (hosts - 1)
    return compute_s + steps * latency_s + steps / hosts * gradient_bytes * 8 / (2 * rate_bits)
'''),
    ("12.step_time", "the slower of compute and the all-reduce, as if overlapped", '''
def predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s):
    if hosts == 1:
        return compute_s
    steps = 2 * (hosts - 1)
    return max(compute_s, steps * latency_s + steps / hosts * gradient_bytes * 8 / rate_bits)
'''),
    ("12.step_time", "a megabit of 2**20 bits", '''
def predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s):
    if hosts == 1:
        return compute_s
    steps = 2 * (hosts - 1)
    rate_bytes = rate_bits / 8 / 1e6 * 2 ** 20
    return compute_s + steps * latency_s + steps / hosts * gradient_bytes / rate_bytes
'''),
    ("11.accumulate", "weighed by the whole number of slices it fits", '''
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    optimizer.zero_grad()
    for x_part, y_part in zip(x.tensor_split(micro_batches), y.tensor_split(micro_batches)):
        loss = torch.nn.functional.mse_loss(model(x_part), y_part) / (len(x) // len(x_part))
        loss.backward()
    optimizer.step()
''', "weigh each slice by its share of the batch"),
    ("11.accumulate", "summed over the rows, averaged over nothing else", '''
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    optimizer.zero_grad()
    for x_part, y_part in zip(x.tensor_split(micro_batches), y.tensor_split(micro_batches)):
        loss = torch.nn.functional.mse_loss(model(x_part), y_part, reduction="sum") / len(x)
        loss.backward()
    optimizer.step()
'''),
    ("04.scaled_lr", "the square root of the scaled rate", '''
import math


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    k = effective_batch_size / base_batch_size
    if rule == "sqrt":
        return math.sqrt(base_lr * k)
    return base_lr * k if rule == "linear" else base_lr
'''),
    ("04.scaled_lr", "k rounded to a whole number", '''
import math


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    k = round(effective_batch_size / base_batch_size)
    return base_lr * {"none": 1.0, "linear": k, "sqrt": math.sqrt(k)}[rule]
''', "divide with /, not //"),
    ("04.scaled_lr", "the linear rule adds k", '''
import math


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    k = effective_batch_size / base_batch_size
    return {"none": base_lr, "linear": base_lr + k, "sqrt": base_lr * math.sqrt(k)}[rule]
'''),
    ("04.scaled_lr", "the rate rounded to 6 decimals", '''
import math


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    k = effective_batch_size / base_batch_size
    return round(base_lr * {"none": 1.0, "linear": k, "sqrt": math.sqrt(k)}[rule], 6)
'''),
    ("01.feature_counts", "levels + 1 interfaces", '''
def feature_counts(levels):
    return 17 + 27 * levels + 2 * (levels + 1) + (levels + 1), 4 * (levels + 1)
''', "levels + 1 half levels and levels - 1 interfaces"),
    ("01.feature_counts", "fluxes on full levels", '''
def feature_counts(levels):
    return 17 + 27 * levels + 2 * (levels + 1) + (levels - 1), 4 * levels
''', "4 fluxes on each half level"),
    ("01.feature_counts", "levels - 1 half levels", '''
def feature_counts(levels):
    return 17 + 27 * levels + 2 * (levels - 1) + (levels - 1), 4 * (levels - 1)
''', "levels + 1 half levels and levels - 1 interfaces"),
    ("01.feature_counts", "(n_y, n_x)", '''
def feature_counts(levels):
    return 4 * (levels + 1), 17 + 27 * levels + 2 * (levels + 1) + (levels - 1)
''', "27 variables on each full level"),
    ("01.normalise", "an epsilon added to the std", '''
def normalise(x):
    return (x - x.mean(dim=0)) / (x.std(dim=0) + 1e-8)
''', "a test for std == 0"),
    ("01.normalise", "the std clamped at the threshold", '''
def normalise(x):
    floor = 1e-6 * x.abs().mean(dim=0)
    return (x - x.mean(dim=0)) / x.std(dim=0, correction=0).clamp_min(floor).clamp_min(1e-30)
''', "a test for std == 0"),
    ("02.optimizer_steps", "at least one step an epoch, floor otherwise", '''
import math


def optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1):
    batches = math.ceil(n_train / batch_size)
    return max(1, batches // accumulate_grad_batches) * epochs
'''),
    ("04.warmup_lr", "a geometric ramp", '''
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    if step >= warmup_steps:
        return target_lr
    return base_lr * (target_lr / base_lr) ** (step / warmup_steps)
'''),
    ("04.noise_scale", "|G|² as an absolute value", '''
def noise_scale_parts(small_sq_norm, big_sq_norm, small_batch, big_batch):
    trace = (small_sq_norm - big_sq_norm) / (1 / small_batch - 1 / big_batch)
    return abs(big_sq_norm - trace / big_batch), trace
'''),
    ("09.buckets", "the first cap for the first two buckets", '''
def ddp_buckets(grad_bytes, first_cap, cap):
    buckets, current, size = [], [], 0
    for index, nbytes in enumerate(grad_bytes):
        current.append(index)
        size += nbytes
        if size >= (first_cap if len(buckets) < 2 else cap):
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets
''', "only the first bucket has first_cap"),
    ("10.stragglers", "either threshold", '''
import statistics


def stragglers(busy_ms, wait_ms):
    slow = []
    for r, b in enumerate(busy_ms):
        typical = statistics.median(busy_ms[:r] + busy_ms[r + 1:])
        if b > 1.3 * typical or b - typical >= 2:
            slow.append(r)
    return slow
''', "flags nobody"),
    ("12.pick_interface", "ip_network on a host's address", '''
import ipaddress


def pick_interface(interfaces, master_addr):
    target = ipaddress.ip_address(master_addr)
    best, best_prefix = None, -1
    for name, addresses in interfaces.items():
        for address in addresses:
            network = ipaddress.ip_network(address)
            if target in network and network.prefixlen > best_prefix:
                best, best_prefix = name, network.prefixlen
    return best
''', "has host bits set"),
    ("12.pick_interface", "the loopback skipped", '''
import ipaddress


def pick_interface(interfaces, master_addr):
    target = ipaddress.ip_address(master_addr)
    best, best_prefix = None, -1
    for name, addresses in interfaces.items():
        if name == "lo":
            continue
        for address in addresses:
            network = ipaddress.ip_interface(address).network
            if target in network and network.prefixlen > best_prefix:
                best, best_prefix = name, network.prefixlen
    return best
'''),
    ("12.pick_interface", "the shortest prefix", '''
import ipaddress


def pick_interface(interfaces, master_addr):
    target = ipaddress.ip_address(master_addr)
    found = [(ipaddress.ip_interface(a).network.prefixlen, n)
             for n, addresses in interfaces.items() for a in addresses
             if target in ipaddress.ip_interface(a).network]
    return min(found)[1] if found else None
'''),
    ("03.per_device_batch", "nodes plus devices", '''
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    world = num_nodes + devices_per_node
    if global_batch_size < world or global_batch_size % world:
        raise ValueError(f"{global_batch_size} does not split over {world} ranks")
    return global_batch_size // world
''', "but it splits evenly"),
    # Fifth round. Told correct before: a numpy array for a tensor, autograd switched off
    # for good, a ramp clamped with min/max when target_lr is below base_lr, | and & for +
    # and % (right for powers of two), `hidden` changed in place, the ranks unsorted or in a
    # set, one median of every rank but the slowest, an interface's first address only.
    ("01.normalise", "a list of lists", '''
import torch


def normalise(x):
    std = x.std(dim=0)
    constant = std <= 1e-6 * x.abs().mean(dim=0)
    z = (x - x.mean(dim=0)) / torch.where(constant, torch.ones_like(std), std)
    return torch.where(constant, 0.0, z).tolist()
''', "return a torch tensor"),
    ("02.predict_wm2", "autograd switched off in the cell", '''
import torch
from kosmoss.model import LitMLP

torch.set_grad_enabled(False)


def predict_wm2(checkpoint_path, x):
    return LitMLP.load_from_checkpoint(checkpoint_path, map_location="cpu").eval()(x)
''', "autograd was switched off"),
    ("02.predict_wm2", "autograd switched off after loading", '''
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    model = LitMLP.load_from_checkpoint(checkpoint_path, map_location="cpu").eval()
    torch.autograd.set_grad_enabled(False)
    prediction = model(x)
    return prediction
''', "autograd is left switched off"),
    ("04.warmup_lr", "the rate clipped between base_lr and target_lr", '''
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    if warmup_steps == 0:
        return target_lr
    rate = base_lr + (target_lr - base_lr) * step / warmup_steps
    return min(max(rate, base_lr), target_lr)
''', "the ramp goes down"),
    ("04.warmup_lr", "no lower than base_lr", '''
def warmup_lr(step, warmup_steps, base_lr, target_lr):
    if warmup_steps == 0 or step >= warmup_steps:
        return target_lr
    return max(base_lr, base_lr + (target_lr - base_lr) * step / warmup_steps)
''', "the ramp goes down"),
    ("07.rank_arithmetic", "the local rank masked", '''
def rank_of(node_rank, local_rank, devices_per_node):
    return node_rank * devices_per_node + local_rank


def place_of(rank, devices_per_node):
    return rank // devices_per_node, rank & (devices_per_node - 1)
''', "no power of two"),
    ("07.rank_arithmetic", "the node shifted", '''
import math


def rank_of(node_rank, local_rank, devices_per_node):
    return (node_rank << int(math.log2(devices_per_node))) + local_rank


def place_of(rank, devices_per_node):
    return divmod(rank, devices_per_node)
''', "shifts and | stand in for * and +"),
    ("08b.sample_limit", "sizes += on the caller's list", '''
def sample_limit(n_x, hidden, n_y, bandwidth, peak_flops):
    sizes = hidden
    sizes += [n_y]
    sizes = [n_x] + sizes
    layers = list(zip(sizes[:-1], sizes[1:]))
    forward = sum(2 * i * o for i, o in layers)
    flop = forward + forward + sum(2 * i * o for i, o in layers[1:])
    rates = [(bandwidth / (4 * (n_x + n_y)), "memory"), (peak_flops / flop, "compute")]
    return min(rates, key=lambda rate: rate[0])
''', "changed the list `hidden`"),
    ("10.stragglers", "a set of ranks", '''
import statistics


def stragglers(busy_ms, wait_ms):
    slow = set()
    for rank, mine in enumerate(busy_ms):
        typical = statistics.median(busy_ms[:rank] + busy_ms[rank + 1:])
        if mine > 1.3 * typical and mine - typical >= 2:
            slow.add(rank)
    return slow
''', "a sorted list"),
    ("10.stragglers", "the median of the ranks but the busiest", '''
import statistics


def stragglers(busy_ms, wait_ms):
    rest = list(busy_ms)
    rest.remove(max(rest))
    typical = statistics.median(rest)
    return [rank for rank, mine in enumerate(busy_ms)
            if mine > 1.3 * typical and mine - typical >= 2]
''', "the slowest included"),
    ("12.pick_interface", "the last address of each interface only", '''
import ipaddress


def pick_interface(interfaces, master_addr):
    target = ipaddress.ip_address(master_addr)
    best, best_prefix = None, -1
    for name, addresses in interfaces.items():
        if addresses:
            network = ipaddress.ip_interface(addresses[-1]).network
            if target in network and network.prefixlen > best_prefix:
                best, best_prefix = name, network.prefixlen
    return best
''', "several addresses"),
    # Fifth round, rejected already: kept so that they stay rejected.
    ("01.normalise", "the constant columns dropped", '''
import torch


def normalise(x):
    std = x.std(dim=0, correction=0)
    keep = std > 1e-6 * x.abs().mean(dim=0)
    return ((x - x.mean(dim=0)) / std)[:, keep]
''', "shape"),
    ("02.predict_wm2", "a single column unsqueezed", '''
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    model = LitMLP.load_from_checkpoint(checkpoint_path, map_location="cpu").eval()
    if len(x) == 1:
        x = x.unsqueeze(0)
    with torch.no_grad():
        return model(x)
''', "a batch of a single column"),
    ("02.optimizer_steps", "whole batches, then steps rounded up", '''
import math


def optimizer_steps(n_train, batch_size, epochs, accumulate_grad_batches=1):
    return math.ceil(n_train // batch_size / accumulate_grad_batches) * epochs
'''),
    ("03.per_device_batch", "a RuntimeError", '''
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    world = num_nodes * devices_per_node
    if global_batch_size < world or global_batch_size % world:
        raise RuntimeError(f"{global_batch_size} does not split over {world} ranks")
    return global_batch_size // world
''', "raise a ValueError"),
    ("03.per_device_batch", "None when it does not split", '''
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    world = num_nodes * devices_per_node
    if global_batch_size < world or global_batch_size % world:
        return None
    return global_batch_size // world
''', "kosmoss refuses it"),
    ("metrics.padding", "what the world lacks over the samples", '''
def padded_duplicates(n_samples, world_size):
    return max(0, world_size - n_samples)
'''),
    ("metrics.padding", "one more sample per rank, always", '''
def padded_duplicates(n_samples, world_size):
    return (int(n_samples / world_size) + 1) * world_size - n_samples
''', "no padding"),
    ("04.scaled_lr", "k in numpy's float32", '''
import numpy as np


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    k = np.float32(effective_batch_size) / np.float32(base_batch_size)
    return base_lr * {"none": 1.0, "linear": k, "sqrt": np.sqrt(k)}[rule]
''', "float32's rounding"),
    ("04.noise_scale", "|G|² from the small batch's norm", '''
def noise_scale_parts(small_sq_norm, big_sq_norm, small_batch, big_batch):
    trace = (small_sq_norm - big_sq_norm) / (1 / small_batch - 1 / big_batch)
    return small_sq_norm - trace / big_batch, trace
'''),
    ("04.noise_scale", "the trace's absolute value", '''
def noise_scale_parts(small_sq_norm, big_sq_norm, small_batch, big_batch):
    trace = abs(small_sq_norm - big_sq_norm) / (1 / small_batch - 1 / big_batch)
    return big_sq_norm - trace / big_batch, trace
''', "0.5 and 0.6"),
    ("05.device_for", "an index too large means the last GPU", '''
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    wants = machine == "force" or (machine == "offer" and run_asks_gpu)
    if not wants or visible_gpus == 0:
        return "cpu"
    index = machine_index if machine_index is not None else 0
    return f"cuda:{min(max(index, 0), visible_gpus - 1)}"
'''),
    ("05.device_for", "force takes GPU 0", '''
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    if visible_gpus == 0 or machine == "none":
        return "cpu"
    if machine == "force":
        return "cuda:0"
    if run_asks_gpu:
        index = machine_index if machine_index is not None else 0
        return f"cuda:{index if 0 <= index < visible_gpus else 0}"
    return "cpu"
'''),
    ("05.memory_share", "ranks per GPU as int() + 1", '''
def memory_share(ranks_on_host, gpus_on_host):
    if gpus_on_host == 0:
        return "gloo", 1.0
    if ranks_on_host <= gpus_on_host:
        return "nccl", 1.0
    return "gloo", 1 / (int(ranks_on_host / gpus_on_host) + 1)
''', "rounded up"),
    ("06.port_holder", "the process's name", '''
import psutil


def port_holder(port):
    for c in psutil.net_connections(kind="tcp"):
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN:
            return psutil.Process(c.pid).name()
    return None
'''),
    ("06.port_holder", "0 when nobody listens", '''
import psutil


def port_holder(port):
    for c in psutil.net_connections(kind="tcp"):
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN:
            return c.pid
    return 0
''', "no TCP listener"),
    ("08.training_memory", "the activations' gradients counted too", '''
from torch import nn


def training_memory(model, batch_size):
    params = sum(p.numel() for p in model.parameters())
    linears = [m for m in model if isinstance(m, nn.Linear)]
    width = linears[0].in_features + linears[-1].out_features
    features = linears[0].in_features
    for layer in model:
        if isinstance(layer, nn.Linear):
            features = layer.out_features
        width += 2 * features
    return 4 * (4 * params + batch_size * width)
'''),
    ("08.bandwidths", "the bus factor in integer division", '''
def bandwidths(nbytes, seconds, world_size):
    algbw = nbytes / seconds
    return algbw, algbw * (2 * (world_size - 1) // world_size)
''', "not a whole number"),
    ("09.buckets", "what goes over the cap carried into the next bucket", '''
def ddp_buckets(grad_bytes, first_cap, cap):
    buckets, current, size, limit = [], [], 0, first_cap
    for index, nbytes in enumerate(grad_bytes):
        current.append(index)
        size += nbytes
        if size >= limit:
            buckets.append(current)
            current, size, limit = [], size - limit, cap
    if current:
        buckets.append(current)
    return buckets
''', "only the first bucket has first_cap"),
    ("09.buckets", "an empty bucket at the end", '''
def ddp_buckets(grad_bytes, first_cap, cap):
    buckets, current, size, limit = [], [], 0, first_cap
    for index, nbytes in enumerate(grad_bytes):
        current.append(index)
        size += nbytes
        if size >= limit:
            buckets.append(current)
            current, size, limit = [], 0, cap
    buckets.append(current)
    return buckets
''', "every bucket holds at least one gradient"),
    ("10.stragglers", "30 percent of its own time", '''
import statistics


def stragglers(busy_ms, wait_ms):
    slow = []
    for rank, mine in enumerate(busy_ms):
        others = statistics.median(busy_ms[:rank] + busy_ms[rank + 1:])
        if (mine - others) / mine > 0.3 and mine - others >= 2:
            slow.append(rank)
    return slow
''', "at least 2 ms is enough"),
    ("11.accumulate", "summed squares over the batch's columns, not its numbers", '''
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    optimizer.zero_grad()
    for x_part, y_part in zip(x.tensor_split(micro_batches), y.tensor_split(micro_batches)):
        loss = torch.nn.functional.mse_loss(model(x_part), y_part, reduction="sum")
        (loss / len(x)).backward()
    optimizer.step()
'''),
    ("11.accumulate", "the gradients zeroed after the step", '''
import torch


def accumulated_step(model, optimizer, x, y, micro_batches):
    for x_part, y_part in zip(x.tensor_split(micro_batches), y.tensor_split(micro_batches)):
        loss = torch.nn.functional.mse_loss(model(x_part), y_part) * len(x_part) / len(x)
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
''', "zero them first"),
    ("12.step_time", "latency twice, whatever the hosts", '''
def predicted_step_s(compute_s, gradient_bytes, hosts, rate_bits, latency_s):
    if hosts == 1:
        return compute_s
    moved = 2 * (hosts - 1) / hosts * gradient_bytes
    return compute_s + 2 * latency_s + moved * 8 / rate_bits
'''),
    # A second attack, 2026-11-29: answers the checkers took for right until then.
    ("01.normalise", "a bound ten times the statement's", '''
import torch


def normalise(x):
    std = x.std(dim=0, correction=0)
    constant = std <= 1e-5 * x.abs().mean(dim=0)
    scaled = (x - x.mean(dim=0)) / torch.where(constant, torch.ones_like(std), std)
    return torch.where(constant, torch.zeros_like(scaled), scaled)
''', "treated as constant", "1e-6"),
    ("01.normalise", "the variance in one pass, E[x²] − mean², in float32", '''
import torch


def normalise(x):
    mean = x.mean(0)
    std = ((x * x).mean(0) - mean * mean).clamp_min(0).sqrt()
    constant = std <= 1e-6 * x.abs().mean(dim=0)
    scaled = (x - mean) / torch.where(constant, torch.ones_like(std), std)
    return torch.where(constant, torch.zeros_like(scaled), scaled)
''', "subtract the mean first"),
    ("02.predict_wm2", "the model loaded once and kept", '''
import torch
from kosmoss.model import LitMLP

_model = None


def predict_wm2(checkpoint_path, x):
    global _model
    if _model is None:
        _model = LitMLP.load_from_checkpoint(checkpoint_path, map_location="cpu").eval()
    with torch.no_grad():
        return _model(x)
''', "first checkpoint"),
    ("02.predict_wm2", "fluxes in half precision", '''
import torch
from kosmoss.model import LitMLP


def predict_wm2(checkpoint_path, x):
    model = LitMLP.load_from_checkpoint(checkpoint_path, map_location="cpu").eval()
    with torch.no_grad():
        return model(x).half()
''', "16-bit"),
    ("03.per_device_batch", "a refusal that names no reason", '''
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    world = num_nodes * devices_per_node
    if global_batch_size < world or global_batch_size % world:
        raise ValueError("oops")
    return global_batch_size // world
''', "does not say why"),
    ("03.per_device_batch", "a refusal that gives a false reason", '''
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    world = num_nodes * devices_per_node
    if global_batch_size < world or global_batch_size % world:
        raise ValueError("the batch size must be a power of two")
    return global_batch_size // world
''', "does not say why"),
    ("03.per_device_batch", "refuses a batch that splits (only powers of two)", '''
def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    world = num_nodes * devices_per_node
    if global_batch_size <= 0 or global_batch_size & (global_batch_size - 1):
        raise ValueError(f"{global_batch_size} is not a power of two")
    if global_batch_size % world:
        raise ValueError(f"{global_batch_size} is not a multiple of {world}")
    return global_batch_size // world
''', "splits evenly"),
    ('11.accumulate', "the optimizer's rate scaled and left so", '''
import torch
import torch.nn.functional as F


def accumulated_step(model, optimizer, x, y, micro_batches):
    # sum the slices' mean losses weighted by their rows, then scale the step by 1/N
    optimizer.zero_grad()
    for xi, yi in zip(torch.tensor_split(x, micro_batches), torch.tensor_split(y, micro_batches)):
        (F.mse_loss(model(xi), yi) * len(xi)).backward()
    for group in optimizer.param_groups:
        group["lr"] /= len(x)
    optimizer.step()
''', 'lr was left changed'),
    ('09.buckets', "the caller's list consumed with pop", '''
def ddp_buckets(grad_bytes, first_cap, cap):
    out, cur, size, limit, i = [], [], 0, first_cap, 0
    while grad_bytes:
        g = grad_bytes.pop(0)
        cur.append(i); size += g; i += 1
        if size >= limit:
            out.append(cur); cur, size, limit = [], 0, cap
    if cur:
        out.append(cur)
    return out
''', 'do not consume it'),
    ('12.pick_interface', 'IPv4 masks by hand, lost on an IPv6 address', '''
def pick_interface(interfaces, master_addr):
    # by hand: compare the masked 32-bit integers
    def to_int(s):
        a, b, c, d = (int(x) for x in s.split("."))
        return (a << 24) | (b << 16) | (c << 8) | d
    m = to_int(master_addr)
    best, best_len = None, -1
    for name, addrs in interfaces.items():
        for a in addrs:
            addr, p = a.split("/")
            p = int(p)
            mask = ((1 << 32) - 1) ^ ((1 << (32 - p)) - 1)
            if (to_int(addr) & mask) == (m & mask) and p > best_len:
                best, best_len = name, p
    return best
''', "negative shift count"),
    ('08.training_memory', "measured by a real Adam step on the caller's model", '''
import torch
from torch import nn
def training_memory(model, batch_size):
    # measure it: run one real Adam step, count what is kept
    first = next(m for m in model if isinstance(m, nn.Linear))
    x = torch.randn(batch_size, first.in_features)
    saved = []
    def pack(t):
        saved.append(t)
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        outs = []
        h = x
        for m in model:
            h = m(h)
            outs.append(h)
    y = torch.randn_like(h)
    loss = nn.functional.mse_loss(h, y)
    opt = torch.optim.Adam(model.parameters())
    opt.zero_grad()
    loss.backward()
    opt.step()
    P = sum(p.numel() * 4 for p in model.parameters())
    G = sum(p.grad.numel() * 4 for p in model.parameters())
    S = sum(v.numel() * 4 for st in opt.state.values() for k, v in st.items() if k != "step")
    A = x.numel() * 4 + sum(o.numel() * 4 for o in outs) + y.numel() * 4
    return P + G + S + A
''', "changed the caller's model"),
    # Found by trying the checkers with wrong answers their authors had not listed: each
    # passed until the case that tells it from the right answer was added.
    ("05.memory_share", "NCCL only when the ranks divide the GPUs", '''
import math


def memory_share(ranks_on_host, gpus_on_host):
    if gpus_on_host == 0:
        return "gloo", 1.0
    backend = "nccl" if gpus_on_host % ranks_on_host == 0 else "gloo"
    return backend, 1.0 / math.ceil(ranks_on_host / gpus_on_host)
''', "3 rank(s) on 4 GPU(s)", "kosmoss uses 'nccl'"),
    ("05.memory_share", "NCCL for one rank or one per GPU", '''
import math


def memory_share(ranks_on_host, gpus_on_host):
    if gpus_on_host == 0:
        return "gloo", 1.0
    backend = "nccl" if ranks_on_host in (1, gpus_on_host) else "gloo"
    return backend, 1.0 / math.ceil(ranks_on_host / gpus_on_host)
''', "kosmoss uses 'nccl'"),
    ("08b.sample_limit", "the first and last hidden layers indexed", '''
def sample_limit(n_x, hidden, n_y, bandwidth, peak_flops):
    macs = n_x * hidden[0] + sum(a * b for a, b in zip(hidden, hidden[1:])) + hidden[-1] * n_y
    forward = 2 * macs
    backward = 2 * forward - 2 * n_x * hidden[0]
    by_memory = bandwidth / (4 * (n_x + n_y))
    by_compute = peak_flops / (forward + backward)
    return (by_memory, "memory") if by_memory <= by_compute else (by_compute, "compute")
''', "hidden []", "IndexError"),
    ("10.stragglers", "a rank's others taken by value", '''
import statistics


def stragglers(busy_ms, wait_ms):
    slow = []
    for rank, mine in enumerate(busy_ms):
        others = [b for b in busy_ms if b != mine]
        if not others:
            continue
        typical = statistics.median(others)
        if mine > typical * 1.3 and mine - typical >= 2:
            slow.append(rank)
    return slow
''', "drop its index, not its value"),
    ("10.stragglers", "a straggler must also wait least", '''
import statistics


def stragglers(busy_ms, wait_ms):
    if len(busy_ms) < 2:
        return []
    slow = []
    for r, mine in enumerate(busy_ms):
        others = statistics.median(busy_ms[:r] + busy_ms[r + 1:])
        waits = statistics.median(wait_ms[:r] + wait_ms[r + 1:])
        if mine > others * 1.3 and mine - others >= 2 and wait_ms[r] < waits:
            slow.append(r)
    return slow
''', "whatever the waits say"),
    ("12.pick_interface", "IPv4 only", '''
import ipaddress


def pick_interface(interfaces, master_addr):
    target = ipaddress.IPv4Address(master_addr)
    best, best_prefix = None, -1
    for name, addresses in interfaces.items():
        for address in addresses:
            if ":" in address:
                continue
            network = ipaddress.IPv4Interface(address).network
            if target in network and network.prefixlen > best_prefix:
                best, best_prefix = name, network.prefixlen
    return best
''', "AddressValueError"),
]

FRESH_DISTRIBUTED = [
    ("03.average_gradients", "divides by the number of parameters", '''
import torch.distributed as dist


def average_gradients(model):
    parameters = list(model.parameters())
    for p in parameters:
        dist.all_reduce(p.grad)
        p.grad /= len(parameters)
'''),
    ("03.average_gradients", "the last layer only, as in a fine-tuning recipe", '''
import torch.distributed as dist


def average_gradients(model):
    for p in list(model.parameters())[-2:]:
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
'''),
    ("metrics.exact_val_loss", "mean times count, over the ranks' counts assumed equal", '''
import torch.distributed as dist


def exact_val_loss(losses):
    weighted = losses.mean() * len(losses)
    dist.all_reduce(weighted)
    return weighted / (len(losses) * dist.get_world_size())
'''),
    ("09.ring_all_reduce", "the ring turned the other way", '''
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(tensor.view(-1), n)
    for step in range(n - 1):
        out, into = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
        request = dist.isend(out.clone(), (rank - 1) % n)
        got = torch.empty_like(into)
        dist.recv(got, (rank + 1) % n)
        request.wait()
        into += got
    for step in range(n - 1):
        out, into = chunks[(rank + 1 - step) % n], chunks[(rank - step) % n]
        request = dist.isend(out.clone(), (rank - 1) % n)
        got = torch.empty_like(into)
        dist.recv(got, (rank + 1) % n)
        request.wait()
        into.copy_(got)
    return tensor
'''),
    ("09.ring_all_reduce", "the all-gather writes one chunk too far", '''
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(tensor.view(-1), n)
    for step in range(n - 1):
        out, into = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
        request = dist.isend(out.clone(), (rank + 1) % n)
        got = torch.empty_like(into)
        dist.recv(got, (rank - 1) % n)
        request.wait()
        into += got
    for step in range(n - 1):
        out, into = chunks[(rank + 1 - step) % n], chunks[(rank - step - 1) % n]
        request = dist.isend(out.clone(), (rank + 1) % n)
        got = torch.empty_like(into)
        dist.recv(got, (rank - 1) % n)
        request.wait()
        into.copy_(got)
    return tensor
'''),
    ("09b.flat", "broadcasts at the first synchronisation, not when built", '''
import torch
import torch.distributed as dist


class FlatDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        self.synced = False

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        if not self.synced:
            for p in self.module.parameters():
                dist.broadcast(p.data, 0)
            self.synced = True
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        torch.nn.utils.vector_to_parameters(flat, grads)
'''),
    ("09b.flat", "offsets counted over every parameter, the frozen one too", '''
import torch
import torch.distributed as dist


class FlatDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        for p in module.parameters():
            dist.broadcast(p.data, 0)

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        params = list(self.module.parameters())
        flat = torch.cat([p.grad.flatten() for p in params if p.grad is not None])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        offset = 0
        for p in params:
            if p.grad is not None:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
'''),
    ("09b.overlap", "waits on the last handle only", '''
import torch
import torch.distributed as dist


class OverlapDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        self.handles = []
        for p in module.parameters():
            dist.broadcast(p.data, 0)
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(
                    lambda q: self.handles.append(dist.all_reduce(q.grad, async_op=True)))

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        self.handles[-1].wait()  # the last one launched finishes last
        self.handles = []
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad /= dist.get_world_size()
'''),
    ("09b.overlap", "hooks registered in forward, every step", '''
import torch
import torch.distributed as dist


class OverlapDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        self.handles = []
        for p in module.parameters():
            dist.broadcast(p.data, 0)

    def forward(self, *inputs):
        for p in self.module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(
                    lambda q: self.handles.append(dist.all_reduce(q.grad, async_op=True)))
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        for handle in self.handles:
            handle.wait()
        self.handles = []
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad /= dist.get_world_size()
'''),
    ("09b.overlap", "waits in the hook, right after launching", '''
import torch
import torch.distributed as dist


class OverlapDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        for p in module.parameters():
            dist.broadcast(p.data, 0)
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self.hook)

    def hook(self, p):
        dist.all_reduce(p.grad, async_op=True).wait()
        p.grad /= dist.get_world_size()

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        pass
'''),
    ("09b.buckets", "parameters sorted by name, last first", '''
import torch
import torch.distributed as dist


class BucketDDP(torch.nn.Module):
    def __init__(self, module, bucket_cap_mb):
        super().__init__()
        self.module = module
        for p in module.parameters():
            dist.broadcast(p.data, 0)
        named = sorted(((n, p) for n, p in module.named_parameters() if p.requires_grad),
                       reverse=True)
        self.buckets, bucket, size = [], [], 0
        for _, p in named:
            bucket.append(p)
            size += p.numel() * 4
            if size >= bucket_cap_mb * 2 ** 20:
                self.buckets.append(bucket)
                bucket, size = [], 0
        if bucket:
            self.buckets.append(bucket)
        self.left = {}
        self.work = []
        for bucket in self.buckets:
            for p in bucket:
                p.register_post_accumulate_grad_hook(lambda q, b=bucket: self.ready(b))

    def ready(self, bucket):
        key = id(bucket)
        self.left[key] = self.left.get(key, len(bucket)) - 1
        if self.left[key] == 0:
            flat = torch.cat([p.grad.flatten() for p in bucket])
            self.work.append((bucket, flat, dist.all_reduce(flat, async_op=True)))

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        for bucket, flat, work in self.work:
            work.wait()
            flat /= dist.get_world_size()
            offset = 0
            for p in bucket:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.work, self.left = [], {}
'''),
    ("09b.buckets", "the cap in kilobytes", '''
import torch
import torch.distributed as dist


class BucketDDP(torch.nn.Module):
    def __init__(self, module, bucket_cap_mb):
        super().__init__()
        self.module = module
        for p in module.parameters():
            dist.broadcast(p.data, 0)
        cap = bucket_cap_mb * 1024
        params = [p for p in module.parameters() if p.requires_grad][::-1]
        self.buckets, bucket, size = [], [], 0
        for p in params:
            bucket.append(p)
            size += p.numel() * p.element_size()
            if size >= cap:
                self.buckets.append(bucket)
                bucket, size = [], 0
        if bucket:
            self.buckets.append(bucket)
        self.left = [len(b) for b in self.buckets]
        self.work = []
        for index, bucket in enumerate(self.buckets):
            for p in bucket:
                p.register_post_accumulate_grad_hook(lambda q, i=index: self.ready(i))

    def ready(self, index):
        self.left[index] -= 1
        if self.left[index] == 0:
            flat = torch.cat([p.grad.flatten() for p in self.buckets[index]])
            self.work.append((index, flat, dist.all_reduce(flat, async_op=True)))

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        for index, flat, work in self.work:
            work.wait()
            flat /= dist.get_world_size()
            offset = 0
            for p in self.buckets[index]:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.work = []
        self.left = [len(b) for b in self.buckets]
'''),
    ("11.row_parallel", "the bias forgotten", '''
import torch.distributed as dist


def row_parallel_forward(h_local, weight_local, bias):
    out = h_local @ weight_local.t()
    dist.all_reduce(out)
    return out
'''),
    ("11.row_parallel", "the weight not transposed", '''
import torch.distributed as dist


def row_parallel_forward(h_local, weight_local, bias):
    out = h_local @ weight_local
    dist.all_reduce(out)
    return out + bias
'''),
    ("10.sum_stats", "the maximum", '''
import torch
import torch.distributed as dist


def sum_stats(stats):
    names = sorted(stats)
    values = torch.tensor([stats[n] for n in names], dtype=torch.float64)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return dict(zip(names, values.tolist()))
'''),
    ("11.zero1_step", "momentum kept, but the step takes the gradient", '''
import torch
import torch.distributed as dist


def zero1_step(params, state, lr):
    rank, world = dist.get_rank(), dist.get_world_size()
    with torch.no_grad():
        for i, p in enumerate(params):
            if i % world == rank:
                buf = state.setdefault(i, torch.zeros_like(p))
                buf.mul_(0.9).add_(p.grad)
                p.sub_(lr * p.grad)
            dist.broadcast(p, src=i % world)
'''),
    # Third round: each entry also names a fragment its verdict must hold.
    ("11.zero1_step", "the first buffer is the gradient itself, not a copy", '''
import torch
import torch.distributed as dist


def zero1_step(params, state, lr):
    rank, world = dist.get_rank(), dist.get_world_size()
    with torch.no_grad():
        for i, p in enumerate(params):
            if i % world == rank:
                if i not in state:
                    state[i] = p.grad
                else:
                    state[i].mul_(0.9).add_(p.grad)
                p.sub_(lr * state[i])
            dist.broadcast(p, src=i % world)
''', "the .grad tensor itself"),
    ("11.zero1_step", "dampening: the gradient weighed by 0.1", '''
import torch
import torch.distributed as dist


def zero1_step(params, state, lr):
    rank, world = dist.get_rank(), dist.get_world_size()
    with torch.no_grad():
        for i, p in enumerate(params):
            if i % world == rank:
                buf = state.setdefault(i, torch.zeros_like(p))
                buf.mul_(0.9).add_(p.grad, alpha=0.1)
                p.sub_(lr * buf)
            dist.broadcast(p, src=i % world)
''', "differ from torch.optim.SGD(momentum=0.9)"),
    ("10.sum_stats", "float16 to halve the bytes", '''
import torch
import torch.distributed as dist


def sum_stats(stats):
    names = sorted(stats)
    values = torch.tensor([stats[n] for n in names], dtype=torch.float16)
    dist.all_reduce(values)
    return {n: float(v) for n, v in zip(names, values)}
''', "a 16-bit float"),
    # Fourth round. Told correct before: the frozen parameter left out of the broadcast (the
    # checker's frozen parameter was the same on every rank).
    ("09b.flat", "the frozen parameter left out of the broadcast", '''
import torch
import torch.distributed as dist


class FlatDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        self.params = [p for p in module.parameters() if p.requires_grad]
        with torch.no_grad():
            for p in self.params:
                dist.broadcast(p, src=0)

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        flat = torch.cat([p.grad.flatten() for p in self.params])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        offset = 0
        for p in self.params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
''', "the frozen one (requires_grad=False) too"),
    ("09b.overlap", "the frozen parameter left out of the broadcast", '''
import torch
import torch.distributed as dist


class OverlapDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        self.handles = []
        for p in module.parameters():
            if p.requires_grad:
                dist.broadcast(p.data, 0)
                p.register_post_accumulate_grad_hook(self.launch)

    def launch(self, p):
        self.handles.append(dist.all_reduce(p.grad, async_op=True))

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        for h in self.handles:
            h.wait()
        self.handles = []
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad /= dist.get_world_size()
''', "the frozen one (requires_grad=False) too"),
    ("09b.buckets", "the frozen parameter left out of the broadcast", '''
import torch
import torch.distributed as dist


class BucketDDP(torch.nn.Module):
    def __init__(self, module, bucket_cap_mb):
        super().__init__()
        self.module = module
        params = [p for p in module.parameters() if p.requires_grad]
        for p in params:  # the ones that train
            dist.broadcast(p.data, 0)
        cap = bucket_cap_mb * 1024 * 1024
        self.buckets, bucket, size = [], [], 0
        for p in reversed(params):
            bucket.append(p)
            size += p.numel() * p.element_size()
            if size >= cap:
                self.buckets.append(bucket)
                bucket, size = [], 0
        if bucket:
            self.buckets.append(bucket)
        self.left = [len(b) for b in self.buckets]
        self.work = []
        for i, b in enumerate(self.buckets):
            for p in b:
                p.register_post_accumulate_grad_hook(lambda q, i=i: self.ready(i))

    def ready(self, i):
        self.left[i] -= 1
        if self.left[i] == 0:
            flat = torch.cat([p.grad.flatten() for p in self.buckets[i]])
            self.work.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        for i, flat, work in self.work:
            work.wait()
            flat /= dist.get_world_size()
            offset = 0
            for p in self.buckets[i]:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.work = []
        self.left = [len(b) for b in self.buckets]
''', "the frozen one (requires_grad=False) too"),
    # Fourth round, rejected already: kept so that they stay rejected.
    ("09b.flat", "floor division by the world size", '''
import torch
import torch.distributed as dist


class FlatDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for p in module.parameters():
                dist.broadcast(p, src=0)

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat)
        flat //= dist.get_world_size()
        for g, part in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))
'''),
    ("09b.flat", "the gradients listed once, at the first step", '''
import torch
import torch.distributed as dist


class FlatDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        self.grads = None
        with torch.no_grad():
            for p in module.parameters():
                dist.broadcast(p, src=0)

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        if self.grads is None:
            self.grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        flat = torch.cat([g.flatten() for g in self.grads])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        for g, part in zip(self.grads, flat.split([g.numel() for g in self.grads])):
            g.copy_(part.view_as(g))
'''),
    ("09b.buckets", "a bucket closes once past the cap, not at it", '''
import torch
import torch.distributed as dist


class BucketDDP(torch.nn.Module):
    def __init__(self, module, bucket_cap_mb):
        super().__init__()
        self.module = module
        for p in module.parameters():
            dist.broadcast(p.data, 0)
        params = [p for p in module.parameters() if p.requires_grad]
        cap = bucket_cap_mb * 1024 * 1024
        self.buckets, bucket, size = [], [], 0
        for p in reversed(params):
            bucket.append(p)
            size += p.numel() * p.element_size()
            if size > cap:
                self.buckets.append(bucket)
                bucket, size = [], 0
        if bucket:
            self.buckets.append(bucket)
        self.left = [len(b) for b in self.buckets]
        self.work = []
        for i, b in enumerate(self.buckets):
            for p in b:
                p.register_post_accumulate_grad_hook(lambda q, i=i: self.ready(i))

    def ready(self, i):
        self.left[i] -= 1
        if self.left[i] == 0:
            flat = torch.cat([p.grad.flatten() for p in self.buckets[i]])
            self.work.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        for i, flat, work in self.work:
            work.wait()
            flat /= dist.get_world_size()
            offset = 0
            for p in self.buckets[i]:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.work = []
        self.left = [len(b) for b in self.buckets]
'''),
    ("09b.buckets", "the cap's megabytes truncated to an integer", '''
import torch
import torch.distributed as dist


class BucketDDP(torch.nn.Module):
    def __init__(self, module, bucket_cap_mb):
        super().__init__()
        self.module = module
        for p in module.parameters():
            dist.broadcast(p.data, 0)
        params = [p for p in module.parameters() if p.requires_grad]
        cap = int(bucket_cap_mb) * 1024 * 1024
        self.buckets, bucket, size = [], [], 0
        for p in reversed(params):
            bucket.append(p)
            size += p.numel() * p.element_size()
            if size >= cap:
                self.buckets.append(bucket)
                bucket, size = [], 0
        if bucket:
            self.buckets.append(bucket)
        self.left = [len(b) for b in self.buckets]
        self.work = []
        for i, b in enumerate(self.buckets):
            for p in b:
                p.register_post_accumulate_grad_hook(lambda q, i=i: self.ready(i))

    def ready(self, i):
        self.left[i] -= 1
        if self.left[i] == 0:
            flat = torch.cat([p.grad.flatten() for p in self.buckets[i]])
            self.work.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        for i, flat, work in self.work:
            work.wait()
            flat /= dist.get_world_size()
            offset = 0
            for p in self.buckets[i]:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.work = []
        self.left = [len(b) for b in self.buckets]
'''),
    ("metrics.exact_val_loss", "mean times count: the empty share's mean is NaN", '''
import torch
import torch.distributed as dist


def exact_val_loss(losses):
    totals = torch.stack([losses.mean() * len(losses), torch.tensor(float(len(losses)))])
    dist.all_reduce(totals)
    return totals[0] / totals[1]
'''),
    ("metrics.exact_val_loss", "an empty share counted as one sample", '''
import torch
import torch.distributed as dist


def exact_val_loss(losses):
    totals = torch.stack([losses.sum(), torch.tensor(float(max(len(losses), 1)))])
    dist.all_reduce(totals)
    return totals[0] / totals[1]
'''),
    ("metrics.exact_val_loss", "sum and count in float16", '''
import torch
import torch.distributed as dist


def exact_val_loss(losses):
    totals = torch.stack([losses.sum(), torch.tensor(float(len(losses)))]).half()
    dist.all_reduce(totals)
    return totals[0].float() / totals[1].float()
'''),
    ("metrics.exact_val_loss", "the mean of the non-empty ranks' means", '''
import torch
import torch.distributed as dist


def exact_val_loss(losses):
    parts = torch.tensor([float(losses.mean()) if len(losses) else 0.0, float(len(losses) > 0)])
    dist.all_reduce(parts)
    return parts[0] / parts[1]
'''),
    ("10.sum_stats", "sums rounded to two decimals", '''
import torch
import torch.distributed as dist


def sum_stats(stats):
    names = sorted(stats)
    values = torch.tensor([stats[n] for n in names], dtype=torch.float64)
    dist.all_reduce(values)
    return {n: round(v, 2) for n, v in zip(names, values.tolist())}
'''),
    ("10.sum_stats", "names sorted by length", '''
import torch
import torch.distributed as dist


def sum_stats(stats):
    names = sorted(stats, key=len)
    values = torch.tensor([stats[n] for n in names], dtype=torch.float64)
    dist.all_reduce(values)
    return dict(zip(names, values.tolist()))
'''),
    ("10.sum_stats", "the mean times 2, the lesson's world size", '''
import torch
import torch.distributed as dist


def sum_stats(stats):
    names = sorted(stats)
    values = torch.tensor([stats[n] for n in names], dtype=torch.float64)
    dist.all_reduce(values)
    return dict(zip(names, (values / dist.get_world_size() * 2).tolist()))
'''),
    ("11.row_parallel", "half the bias on each rank, as at 2 ranks", '''
import torch.distributed as dist


def row_parallel_forward(h_local, weight_local, bias):
    out = h_local @ weight_local.T + bias / 2
    dist.all_reduce(out)
    return out
'''),
    ("11.row_parallel", "the bias on the last rank, if it holds features", '''
import torch.distributed as dist


def row_parallel_forward(h_local, weight_local, bias):
    out = h_local @ weight_local.T
    if dist.get_rank() == dist.get_world_size() - 1 and h_local.shape[1]:
        out = out + bias
    dist.all_reduce(out)
    return out
'''),
    ("11.row_parallel", "partial products gathered, then summed", '''
import torch
import torch.distributed as dist


def row_parallel_forward(h_local, weight_local, bias):
    partial = h_local @ weight_local.T
    pieces = [torch.empty_like(partial) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, partial)
    return torch.stack(pieces).sum(dim=0) + bias
'''),
    ("09.ring_all_reduce", "n steps in the all-gather", '''
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(tensor.view(-1), n)
    for step in range(n - 1):
        out, into = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
        request = dist.isend(out.clone(), (rank + 1) % n)
        got = torch.empty_like(into)
        dist.recv(got, (rank - 1) % n)
        request.wait()
        into += got
    for step in range(n):
        out, into = chunks[(rank + 1 - step) % n], chunks[(rank - step) % n]
        request = dist.isend(out.clone(), (rank + 1) % n)
        got = torch.empty_like(into)
        dist.recv(got, (rank - 1) % n)
        request.wait()
        into.copy_(got)
    return tensor
'''),
    ("11.zero1_step", "the learning rate in the buffer too", '''
import torch
import torch.distributed as dist


def zero1_step(params, state, lr):
    rank, world = dist.get_rank(), dist.get_world_size()
    with torch.no_grad():
        for i, p in enumerate(params):
            if i % world == rank:
                buf = state.setdefault(i, torch.zeros_like(p))
                buf.mul_(0.9).add_(lr * p.grad)
                p.sub_(lr * buf)
            dist.broadcast(p, src=i % world)
'''),
    # A second attack, 2026-11-29: answers the checkers took for right until then.
    ("metrics.exact_val_loss", "the caller's losses divided in place", '''
import torch
import torch.distributed as dist


def exact_val_loss(losses):
    n = torch.tensor(float(losses.numel()))
    dist.all_reduce(n)
    losses /= n
    total = losses.sum()
    dist.all_reduce(total)
    return total
''', "in place"),
    ("metrics.exact_val_loss", "a one-element tensor, not a number", '''
import torch
import torch.distributed as dist


def exact_val_loss(losses):
    t = torch.stack([losses.sum(), torch.tensor(float(losses.numel()))]).double()
    dist.all_reduce(t)
    return t[:1] / t[1:]
''', "zero-dimensional"),
    ("03.average_gradients", "a new .grad, not the one backward filled", '''
import torch.distributed as dist


def average_gradients(model):
    for p in model.parameters():
        g = p.grad.clone()
        dist.all_reduce(g)
        p.grad = g / dist.get_world_size()
''', "in place"),
    ('09.ring_all_reduce', 'each chunk sent straight to its owner, not round a ring', '''
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    # reduce-scatter then all-gather: rank r owns chunk r
    n, r = dist.get_world_size(), dist.get_rank()
    chunks = torch.tensor_split(tensor.view(-1), n)
    # reduce-scatter: send chunk c to its owner c, add what the others send me
    reqs = [dist.isend(chunks[c].clone(), c) for c in range(n) if c != r]
    for src in range(n):
        if src != r:
            buf = torch.empty_like(chunks[r])
            dist.recv(buf, src)
            chunks[r].add_(buf)
    for q in reqs:
        q.wait()
    # all-gather: send my summed chunk to everyone
    reqs = [dist.isend(chunks[r].clone(), c) for c in range(n) if c != r]
    for src in range(n):
        if src != r:
            buf = torch.empty_like(chunks[src])
            dist.recv(buf, src)
            chunks[src].copy_(buf)
    for q in reqs:
        q.wait()
''', 'in a ring every rank sends only to its'),
    ('09b.overlap', "every all-reduce launched from the last gradient's hook", '''
import torch
import torch.distributed as dist


class OverlapDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for p in self.module.parameters():
                dist.broadcast(p, src=0)
        self.trainable = [p for p in self.module.parameters() if p.requires_grad]
        self.ready = []
        self.pending = []
        for p in self.trainable:
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p):
        # launch once every gradient is complete, so that no all-reduce reads a half-made one
        self.ready.append(p)
        if len(self.ready) == len(self.trainable):
            for q in self.ready:
                self.pending.append((dist.all_reduce(q.grad, async_op=True), q))
            self.ready = []

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        n = dist.get_world_size()
        for h, p in self.pending:
            h.wait()
            p.grad /= n
        self.pending = []
''', 'nothing overlaps'),
    ('09b.overlap', 'the handles kept from step to step', '''
import torch
import torch.distributed as dist


class OverlapDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for p in self.module.parameters():
                dist.broadcast(p, src=0)
        self.pending = []
        for p in self.module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p):
        self.pending.append(dist.all_reduce(p.grad, async_op=True))

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        n = dist.get_world_size()
        for h in self.pending:
            h.wait()
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad /= n
''', 'memory grows'),
    ('10.sum_stats', "the sums written into the caller's dict", '''
import torch
import torch.distributed as dist
def sum_stats(stats):
    for k in sorted(stats):
        t = torch.tensor([stats[k]], dtype=torch.float64)
        dist.all_reduce(t)
        stats[k] = t.item()
    return stats
''', 'return a new dict'),
    ("03.average_gradients", "launched asynchronously, divided before it ends", '''
import torch.distributed as dist


def average_gradients(model):
    world = dist.get_world_size()
    works = []
    for p in model.parameters():
        if p.grad is not None:
            works.append(dist.all_reduce(p.grad, async_op=True))
            p.grad /= world
    for work in works:
        work.wait()
'''),
    ("10.sum_stats", "the names in a set's order (string hashes differ between processes)", '''
import torch
import torch.distributed as dist


def sum_stats(stats):
    names = list(set(stats))
    values = torch.tensor([float(stats[n]) for n in names], dtype=torch.float64)
    dist.all_reduce(values)
    return dict(zip(names, values.tolist()))
''', "the ranks reduced their entries in different orders"),
    ("metrics.exact_val_loss", "every loss padded to the longest share and all_gathered", '''
import torch
import torch.distributed as dist


def exact_val_loss(losses):
    count = torch.tensor([losses.numel()])
    counts = [torch.zeros_like(count) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, count)
    longest = int(max(counts))
    padded = torch.zeros(longest)
    padded[:losses.numel()] = losses
    parts = [torch.zeros(longest) for _ in counts]
    dist.all_gather(parts, padded)
    values = torch.cat([part[:int(n)] for part, n in zip(parts, counts)])
    return float(values.double().mean())
''', "sends every sample's loss to the other ranks (all_gather)"),
    ("metrics.exact_val_loss", "every loss placed in a split-sized buffer and all_reduced", '''
import torch
import torch.distributed as dist


def exact_val_loss(losses):
    counts = torch.zeros(dist.get_world_size(), dtype=torch.long)
    counts[dist.get_rank()] = losses.numel()
    dist.all_reduce(counts)
    start = int(counts[:dist.get_rank()].sum())
    every = torch.zeros(int(counts.sum()), dtype=torch.float64)
    every[start:start + losses.numel()] = losses.double()
    dist.all_reduce(every)
    return float(every.mean())
''', "sends every sample's loss to the other ranks (all_reduce)"),
    # Found 2026-12-07 by trying slips the catalogues lacked: each was called correct until
    # its case came (two nodes' LOCAL_* variables, a changing rate, names sharing a first
    # letter, new memory behind .grad or the tensor, the caller's bias changed).
    ('03.average_gradients', 'p.grad.data = ... (new storage)', '''
import torch.distributed as dist


def average_gradients(model):
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data = param.grad.data / size
''', 'new memory behind the old one'),
    ('03.average_gradients', 'divides by LOCAL_WORLD_SIZE', '''
import os
import torch.distributed as dist


def average_gradients(model):
    world = int(os.environ["LOCAL_WORLD_SIZE"])  # torchrun's --nproc-per-node
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= world
''', 'divide by the world size'),
    ('10.sum_stats', 'sorted by key=lambda item: item[0] on the keys', '''
import torch
import torch.distributed as dist


def sum_stats(stats):
    names = sorted(stats, key=lambda item: item[0])
    values = torch.tensor([float(stats[n]) for n in names], dtype=torch.float64)
    dist.all_reduce(values)
    return dict(zip(names, values.tolist()))
''', 'agree on one order'),
    ('11.row_parallel', 'bias /= world size in place', '''
import torch.distributed as dist


def row_parallel_forward(h_local, weight_local, bias):
    bias /= dist.get_world_size()  # every rank adds its share of the bias
    out = h_local @ weight_local.T + bias
    dist.all_reduce(out)
    return out
''', 'changed the bias it was given'),
    ('11.row_parallel', 'bias on LOCAL_RANK 0 before the sum', '''
import os
import torch.distributed as dist


def row_parallel_forward(h_local, weight_local, bias):
    partial = h_local @ weight_local.T
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        partial = partial + bias
    dist.all_reduce(partial)
    return partial
''', 'the bias counted 2 times'),
    ('11.zero1_step', 'lr folded into the buffer (v = 0.9 v + lr g; p -= v)', '''
import torch
import torch.distributed as dist


def zero1_step(params, state, lr):
    rank, world = dist.get_rank(), dist.get_world_size()
    with torch.no_grad():
        for i, p in enumerate(params):
            if i % world == rank:
                v = state.setdefault(i, torch.zeros_like(p))
                v.mul_(0.9).add_(p.grad, alpha=lr)
                p.sub_(v)
            dist.broadcast(p, src=i % world)
''', 'the rate went into the buffer'),
    ('11.zero1_step', 'owner compared with LOCAL_RANK', '''
import os
import torch
import torch.distributed as dist


def zero1_step(params, state, lr):
    rank = int(os.environ["LOCAL_RANK"])
    world = dist.get_world_size()
    with torch.no_grad():
        for i, p in enumerate(params):
            if i % world == rank:
                buf = state.setdefault(i, torch.zeros_like(p))
                buf.mul_(0.9).add_(p.grad)
                p.sub_(lr * buf)
            dist.broadcast(p, src=i % world)
''', 'never moved'),
    ('09.ring_all_reduce', 'result computed in a copy, then tensor.data = result', '''
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    flat = tensor.flatten().clone()
    chunks = torch.tensor_split(flat, n)
    for step in range(n - 1):
        outgoing, incoming = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
        request = dist.isend(outgoing.clone(), right)
        received = torch.empty_like(incoming)
        dist.recv(received, left)
        request.wait()
        incoming += received
    for step in range(n - 1):
        outgoing, incoming = chunks[(rank + 1 - step) % n], chunks[(rank - step) % n]
        request = dist.isend(outgoing.clone(), right)
        received = torch.empty_like(incoming)
        dist.recv(received, left)
        request.wait()
        incoming.copy_(received)
    tensor.data = flat.view_as(tensor)
    return tensor
''', 'now holds new memory'),
]


def _check(cases, **limits):
    items = [(find(exercise_id), find(exercise_id).cell(body))
             for exercise_id, _, body, *_ in cases]
    return judge_sources(items, **limits)


def _rejected(cases, verdicts):
    for (exercise_id, name, _, *says), verdict in zip(cases, verdicts):
        assert verdict.status in (WRONG, ERROR), (exercise_id, name, verdict.line)
        assert len(verdict.message) > 30, (exercise_id, name, verdict.line)
        assert all(fragment in verdict.line for fragment in says), (exercise_id, name,
                                                                    verdict.line)


def test_fresh_wrong_answers_are_rejected():
    _rejected(FRESH, _check(FRESH))


@pytest.mark.slow
def test_fresh_wrong_distributed_answers_are_rejected():
    _rejected(FRESH_DISTRIBUTED, _check(FRESH_DISTRIBUTED))
