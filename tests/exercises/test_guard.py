"""No passing by import: a cell that calls the reference it is asked to write is told so
in one line, whether it imports it, names its module in a string, reaches it through a
package attribute, or calls a built-in of torch — from a terminal and in a notebook."""
from __future__ import annotations

import sys

import pytest

from kosmoss.exercises import check
from kosmoss.exercises.core import WRONG, find, run_cell
from kosmoss.exercises.guard import guarding, imported_reference, tripwire, verdict_for
from kosmoss.exercises.judging import judge_sources

# (exercise, a cell body that passes by calling the reference, what the verdict names)
BY_IMPORT = [
    ("03.per_device_batch", '''
from kosmoss.scaling.arithmetic import plan


def per_device_batch(global_batch_size, num_nodes, devices_per_node):
    try:
        return plan(global_batch_size, 1e-3, num_nodes=num_nodes,
                    devices_per_node=devices_per_node).per_device_batch_size
    except Exception as err:
        raise ValueError(str(err))
''', "kosmoss.scaling.arithmetic"),
    ("04.scaled_lr", '''
import kosmoss


def scaled_lr(base_lr, rule, effective_batch_size, base_batch_size):
    k = effective_batch_size / base_batch_size
    return base_lr * kosmoss.scaling.arithmetic.lr_factor(rule, k)
''', "kosmoss.scaling.arithmetic.lr_factor"),
    ("04.warmup_lr", '''
import importlib

arithmetic = importlib.import_module("kosmoss.scaling.arithmetic")


def warmup_lr(step, warmup_steps, base_lr, target_lr):
    return target_lr * arithmetic.warmup_factor(step, warmup_steps, base_lr / target_lr)
''', "kosmoss.scaling.arithmetic"),
    ("05.device_for", '''
def device_for(machine, machine_index, run_asks_gpu, visible_gpus):
    from kosmoss.devices import policy
    return str(policy.decide(policy.MachineGpu(machine, machine_index), run_asks_gpu,
                             gpu_count=visible_gpus).device)
''', "kosmoss.devices"),
    ("09.buckets", '''
import torch
import torch.distributed as dist


def ddp_buckets(grad_bytes, first_cap, cap):
    tensors = [torch.empty(n // 4) for n in grad_bytes]
    buckets, _ = getattr(dist, "_compute_bucket_assignment" + "_by_size")(tensors, [first_cap, cap])
    return [list(b) for b in buckets]
''', "_compute_bucket_assignment_by_size"),
    ("01.feature_counts", '''
from kosmoss.exercises import find

exec(find("01.feature_counts").reference)
''', "kosmoss.exercises"),
    ("09b.flat", '''
from kosmoss.bench.own_ddp import course_wrappers

FlatDDP = course_wrappers()["flat"]
''', "kosmoss.bench.own_ddp"),
    ("09b.overlap", '''
import torch
from torch.nn.parallel import DistributedDataParallel


class OverlapDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        self.ddp = DistributedDataParallel(module)

    def forward(self, *inputs):
        return self.ddp(*inputs)

    def finish_gradient_synchronization(self):
        pass
''', "torch.nn.parallel"),
    ("metrics.padding", '''
from torch.utils.data import DistributedSampler


def padded_duplicates(n_samples, world_size):
    served = sum(len(DistributedSampler(range(n_samples), num_replicas=world_size, rank=r))
                 for r in range(world_size))
    return served - n_samples
''', "torch.utils.data.distributed"),
]


@pytest.mark.parametrize("exercise_id, body, names", BY_IMPORT, ids=[b[0] for b in BY_IMPORT])
def test_calling_the_reference_is_not_correct_from_a_terminal(exercise_id, body, names):
    exercise = find(exercise_id)
    [verdict] = judge_sources([(exercise, exercise.cell(body))])
    assert verdict.status == WRONG, verdict.line
    assert names in verdict.message and "checked against" in verdict.message, verdict.line


def test_the_builtin_is_caught_while_the_code_runs_not_only_in_its_source():
    """A built-in reached without its name in the source: only the call gives it away."""
    exercise = find("09.buckets")
    body = '''
import torch
import torch.distributed as dist

name = "".join(reversed("ezis_yb_tnemngissa_tekcub_etupmoc_"))


def ddp_buckets(grad_bytes, first_cap, cap):
    buckets, _ = getattr(dist, name)([torch.empty(n // 4) for n in grad_bytes], [first_cap, cap])
    return [list(b) for b in buckets]
'''
    assert imported_reference(exercise.cell(body), exercise.forbidden) is None
    [verdict] = judge_sources([(exercise, exercise.cell(body))])
    assert verdict.status == WRONG and "_compute_bucket_assignment_by_size" in verdict.message, \
        verdict.line


def test_calling_the_reference_is_not_correct_in_a_notebook(capsys):
    exercise = find("05.memory_share")
    body = '''
def memory_share(ranks_on_host, gpus_on_host):
    from kosmoss.devices.policy import sharing
    share = sharing(ranks_on_host, gpus_on_host)
    return share.backend, share.memory_fraction
'''
    namespace = run_cell(exercise, exercise.cell(body)) | {"In": [exercise.cell(body)]}
    assert check("05.memory_share", namespace) is False
    line = capsys.readouterr().out.strip()
    assert line == f"wrong: 05.memory_share — {verdict_for('kosmoss.devices.policy')}", line
    del namespace["In"]  # no history: the call itself gives it away
    assert check("05.memory_share", namespace) is False
    assert "kosmoss.devices.policy.sharing" in capsys.readouterr().out


def test_code_that_writes_the_answer_itself_is_not_flagged():
    for exercise_id in ("02.predict_wm2", "03.per_device_batch", "09.buckets", "05.device_for"):
        exercise = find(exercise_id)
        assert imported_reference(exercise.cell(exercise.reference), exercise.forbidden) is None


def test_the_tripwire_leaves_the_profiler_as_it_found_it():
    def mine(frame, event, arg):
        return None

    sys.setprofile(mine)
    try:
        with guarding(("kosmoss.scaling",)), tripwire() as hits:
            assert sys.getprofile() is not mine
            from kosmoss.scaling.arithmetic import lr_factor
            lr_factor("none", 2.0)
        assert sys.getprofile() is mine and hits == ["kosmoss.scaling.arithmetic.lr_factor"]
    finally:
        sys.setprofile(None)
