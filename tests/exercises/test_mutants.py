"""Mutation testing of the checkers: each mutant weakens one checker (a tolerance widened
to the old "1 %", an input at the edge dropped, a check of the answer's type removed,
the world sizes cut to 2, a part of the verdict left out) by editing its module's
source. A mutant is caught when the catalogue test (test_checkers.py) would fail under
it: a catalogued mistake is then called correct, rejected at other world sizes or
without the phrase that names it, or a right answer (right_answers.py) is rejected.

Mutants of what runs in the ranks (their inputs) are not here: the judges run in this
process, on what the ranks returned, so a distributed checker's judge is mutated and
re-run on one launch's outcomes. docs/exercises.md reports the counts.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import types

import pytest
from right_answers import answers
from test_fresh_wrong_answers import FRESH
from test_wrong_answers_once_told_correct import ONCE_TOLD

from kosmoss.exercises import exercises
from kosmoss.exercises.core import CORRECT, ERROR, WRONG, find, run_cell
from kosmoss.exercises.guard import guarding
from kosmoss.exercises.judging import judge_checked, verdict

# (exercise, what the mutant weakens, the checker's source, the mutant's)
MUTANTS = [
    ("01.feature_counts", "no level count drawn afresh",
     "    return LEVELS + (random.SystemRandom().choice(unseen),)", "    return LEVELS"),
    ("01.feature_counts", "any number is a count",
     "            if not is_integer(value):", "            if False:"),
    ("01.normalise", "no column constant to float32 (exact constants instead)",
     "torch.where(torch.arange(n) % 2 == 0, pressure, step_up)", "pressure"),
    ("01.normalise", "no negative column",
     "torch.where(torch.arange(n) % 3 == 0, offset, torch.nextafter(offset, pressure))",
     "-offset"),
    ("01.normalise", "no tiny-valued feature",
     "               1e-10 * (1 + 0.005 * torch.randn(n, generator=g)),\n"
     "               torch.zeros(n),\n"
     "               1e-5 * (1 + 0.3 * torch.rand(n, generator=g)),",
     "               1e3 * (1 + 0.005 * torch.randn(n, generator=g)),\n"
     "               torch.zeros(n),\n"
     "               1e3 * (1 + 0.3 * torch.rand(n, generator=g)),"),
    ("01.normalise", "constant columns near 0 are 0",
     "        if bool((mine == 0).all()):", "        if bool((mine.abs() < 0.1).all()):"),
    ("01.normalise", "one std convention only",
     "for correction in (0, 1)]", "for correction in (0,)]"),
    ("02.predict_wm2", "a batch of five columns only",
     "PREDICT_BATCHES = (5, 1)", "PREDICT_BATCHES = (5,)"),
    ("02.predict_wm2", "a 1 % tolerance",
     "    tolerance = predict_tolerance(model, x)",
     "    tolerance = 0.01 * float(expected.abs().max())"),
    ("02.predict_wm2", "gradients not looked at",
     "    if got.requires_grad:", "    if False:"),
    ("02.predict_wm2", "any tensor-like answer",
     "    if not isinstance(got, torch.Tensor):\n",
     "    got = torch.as_tensor(got)\n    if not isinstance(got, torch.Tensor):\n"),
    ("02.optimizer_steps", "only set-ups where the batches divide",
     "STEPS_CASES = ((10, 4, 2, 1), (10, 3, 1, 2), (9, 3, 2, 2), (7, 2, 3, 3), (12, 4, 1, 1),\n"
     "               (3, 4, 2, 1), (10, 3, 2, 5))",
     "STEPS_CASES = ((12, 4, 1, 1), (9, 3, 2, 1))"),
    ("02.optimizer_steps", "any number is a count",
     "        if not is_integer(got):", "        if False:"),
    ("02.optimizer_steps", "one epoch only",
     "STEPS_CASES = ((10, 4, 2, 1), (10, 3, 1, 2), (9, 3, 2, 2), (7, 2, 3, 3), (12, 4, 1, 1),\n"
     "               (3, 4, 2, 1), (10, 3, 2, 5))",
     "STEPS_CASES = ((10, 4, 1, 1), (10, 3, 1, 2), (9, 3, 1, 2), (7, 2, 1, 3), (12, 4, 1, 1),\n"
     "               (3, 4, 1, 1), (10, 3, 1, 5))"),
    ("03.per_device_batch", "no empty batch",
     "(3, 1, 4), (0, 1, 2), (126, 1, 2))", "(3, 1, 4), (126, 1, 2))"),
    ("03.per_device_batch", "any exception is a refusal",
     "        if isinstance(err, ValueError) and str(err).strip():",
     "        if True:"),
    ("03.per_device_batch", "a refusal need not say why",
     "        if isinstance(err, ValueError) and str(err).strip():",
     "        if isinstance(err, ValueError):"),
    ("03.per_device_batch", "any number is a batch size",
     "        if not is_integer(got):", "        if False:"),
    ("04.scaled_lr", "whole k only",
     "SCALED_CASES = ((1e-3, 128, 64), (1e-3, 1024, 64), (3e-4, 512, 16), (1e-3, 100, 16),\n"
     "                (5e-3, 64, 64), (1e-3, 48, 32), (2e-3, 32, 64), (1e-3, 24, 256))",
     "SCALED_CASES = ((1e-3, 128, 64), (1e-3, 1024, 64), (3e-4, 512, 16), (5e-3, 64, 64))"),
    ("04.scaled_lr", "k never below one",
     "(1e-3, 48, 32), (2e-3, 32, 64), (1e-3, 24, 256))", "(1e-3, 48, 32))"),
    ("04.scaled_lr", "a 1e-6 tolerance",
     "SCALED_ROUNDINGS = 8", "SCALED_ROUNDINGS = 2 ** 47"),
    ("04.warmup_lr", "no step past the warm-up",
     "WARMUP_PAST = 6", "WARMUP_PAST = 1"),
    ("04.warmup_lr", "no warm-up of zero steps",
     "(0, 1e-3, 4e-3),\n", ""),
    ("04.warmup_lr", "a 1e-6 tolerance",
     "WARMUP_ROUNDINGS = 12", "WARMUP_ROUNDINGS = 2 ** 47"),
    ("05.device_for", "no negative index",
     "(None, 0, 1, 2, 3, -1)", "(None, 0, 1, 2, 3)"),
    ("05.device_for", "indexes that exist only",
     "(None, 0, 1, 2, 3, -1)", "(None, 0)"),
    ("05.device_for", "a GPU always visible",
     "(False, True), (0, 1, 2, 3)", "(False, True), (1, 2, 3)"),
    ("05.memory_share", "never as many ranks as GPUs",
     "SHARE_CASES = ((2, 0), (1, 1), (2, 2), (4, 4), (2, 1),",
     "SHARE_CASES = ((2, 0), (2, 1),"),
    ("05.memory_share", "ranks always a multiple of the GPUs",
     "(3, 2), (5, 2), (7, 3),\n", ""),
    ("05.memory_share", "no host without a GPU",
     "SHARE_CASES = ((2, 0), ", "SHARE_CASES = ("),
    ("06.port_holder", "no socket on the port but a TCP listener",
     '    for kind in ("udp", "client"):', '    for kind in ():'),
    ("06.port_holder", "any answer but None is the pid",
     "        if got != pid or isinstance(got, bool):", "        if got is None:"),
    ("07.rank_arithmetic", "two ranks per node only",
     "JOBS = ((1, 4), (3, 1), (2, 2), (3, 4), (4, 8))", "JOBS = ((2, 2), (1, 2))"),
    ("07.rank_arithmetic", "any number is a rank",
     "                        not all(is_integer(v) for v in place):",
     "                        False:"),
    ("08.training_memory", "a 1 % tolerance",
     "        if got != measured:", "        if abs(got - measured) > 0.01 * measured:"),
    ("08.training_memory", "batches of one column only",
     "MODELS = (((300, 100, 100, 100, 552), 64), ((40, 64, 16), 200), ((10, 4), 3),\n"
     "          ((300, 100, 100, 100, 552), 1))\n"
     "# An MLP that ends with an activation (fluxes are positive): read the layers, assume no "
     "shape.\nENDING_IN_SILU = ((40, 64, 16), 8)\n# Layers without a bias (nn.Linear(..., "
     "bias=False)): count the parameters there are.\nWITHOUT_BIASES = ((40, 64, 16), 8)",
     "MODELS = (((300, 100, 100, 100, 552), 1), ((40, 64, 16), 1), ((10, 4), 1))\n"
     "ENDING_IN_SILU = ((40, 64, 16), 1)\nWITHOUT_BIASES = ((40, 64, 16), 1)"),
    ("08.training_memory", "every layer with a bias",
     "                     functools.partial(build, sizes, bias=False), batch)]",
     "                     functools.partial(build, sizes), batch)]"),
    ("08b.sample_limit", "no compute-bound case",
     "               (1024, [8192, 8192], 1024, 3.35e12, 989e12),\n"
     "               (256, [4096, 4096], 16, 3.35e12, 989e12),\n", ""),
    ("08b.sample_limit", "a 10 % tolerance",
     "EXACT = 1e-12", "EXACT = 0.1"),
    ("08b.sample_limit", "the bound not checked",
     "        if bound != right_bound:", "        if False:"),
    ("08.bandwidths", "two ranks only",
     "BANDWIDTH_CASES = ((1e9, 0.5, 8), (4e8, 0.1, 2), (2.5e7, 3e-3, 3), (2.5e7, 3e-3, 4),\n"
     "                   (3e9, 0.25, 16), (1e6, 1e-3, 1))",
     "BANDWIDTH_CASES = ((4e8, 0.1, 2),)"),
    ("metrics.padding", "no split that divides",
     "PADDING_CASES = ((10, 4), (8, 2), (7, 3), (5, 8), (100, 7), (1001, 2), (9, 3), (1, 4))",
     "PADDING_CASES = ((10, 4), (7, 3), (5, 8), (100, 7), (1, 4))"),
    ("metrics.padding", "any number is a count",
     "        if got != expected or not is_integer(got):", "        if got != expected:"),
    ("09.buckets", "no bucket that reaches its cap exactly",
     "                ((100,) * 10, 150, 300), ((600, 100, 100, 100, 100), 500, 500),\n"
     "                ((4000, 4000, 4000), 1000, 6000), ((12, 20, 28, 40), 24, 1000),\n"
     "                ((100, 100, 100, 100), 200, 200), ((8000, 40, 40), 100, 100),\n"
     "                ((40, 80, 120, 160, 200), 400, 100))",
     "                ((600, 100, 100, 100, 100), 500, 500),\n"
     "                ((4000, 4000, 4000), 1000, 6000), ((12, 20, 28, 40), 24, 1000),\n"
     "                ((8000, 40, 40), 100, 100))"),
    ("09.buckets", "the first cap always the others'",
     "BUCKET_CASES = ((MLP_READY_ORDER, MIB, 25 * MIB), (MLP_READY_ORDER, MIB // 4, MIB // 4),\n"
     "                ((100,) * 10, 150, 300), ((600, 100, 100, 100, 100), 500, 500),\n"
     "                ((4000, 4000, 4000), 1000, 6000), ((12, 20, 28, 40), 24, 1000),\n",
     "BUCKET_CASES = ((MLP_READY_ORDER, MIB // 4, MIB // 4),\n"
     "                ((600, 100, 100, 100, 100), 500, 500),\n"),
    ("10.stragglers", "no rank exactly on a threshold",
     "    ((10.0, 10.0, 13.0), (3.0, 3.0, 0.5)),  # exactly 30 % more: not more than 30 %\n"
     "    ((5.0, 5.0, 7.0), (2.0, 2.0, 0.5)),  # 40 % more and exactly 2 ms: a straggler\n", ""),
    ("10.stragglers", "no more than three ranks",
     "    ((3.0, 3.0, 6.0, 6.0), (4.0, 4.0, 1.0, 1.0)),  # two slow of four: each's others "
     "median 3\n"
     "    ((2.0, 2.0, 2.0, 30.0, 9.0), (28.0, 28.0, 28.0, 0.5, 21.0)),  # a mean would hide "
     "rank 4\n",
     ""),
    ("11.accumulate", "batches that divide only",
     "ACCUMULATE_CASES = ((32, 4), (24, 3), (16, 1), (10, 4), (7, 3), (5, 5))",
     "ACCUMULATE_CASES = ((32, 4), (24, 3), (16, 1))"),
    ("11.accumulate", "gradients start at zero",
     "STALE_GRADIENT = 3.0", "STALE_GRADIENT = 0.0"),
    ("11.accumulate", "optimizer steps not counted",
     "    if steps != 1:", "    if False:"),
    ("04.noise_scale", "no step whose |G|² comes out negative",
     "    message = _noise_mistake(noisy, expected, (10.0, 0.5, 16, 256))", "    message = None"),
    ("04.noise_scale", "tr(Σ) not compared",
     "           for v, e, scale in zip(values, expected, scales)):",
     "           for v, e, scale in zip(values[:1], expected[:1], scales[:1])):"),
    ("04.noise_scale", "the swapped parts not named",
     "    if near(values[0], trace) and near(values[1], g_sq):", "    if False:"),
]

# Mutants that survive, and why that is no missing test: no plausible mistake lies in
# what they let through. A test checks that they do survive, so that this stays true.
SURVIVORS = [
    ("01.normalise", "a 1 % tolerance",
     "    return 2 * first_order + 2 * FLOAT32_UNIT * z.abs()",
     "    return 0.01 + 0 * z.abs()",
     "the smallest catalogued error is a 16-bit float's rounding, about 3 % here; no "
     "plausible mistake was found between float32's rounding and 1 %"),
    ("11.accumulate", "a 1 % tolerance",
     "    if gap <= accumulate_tolerance(x, y):",
     "    if gap <= 0.01 * float(expected.abs().max()):",
     "every catalogued mistake moves the weights by 10 % of the step or more; a slice's "
     "weight is either right or off by whole fractions of the batch"),
]

# Mutants of the distributed judges: re-judged on one launch's outcomes.
DISTRIBUTED_MUTANTS = [
    ("03.average_gradients", "two ranks only",
     'names=("average_gradients",),', 'names=("average_gradients",), world_sizes=(2,),'),
    ("03.average_gradients", "a 1 % tolerance",
     "    return gamma(n + 1) * total / n + torch.finfo(torch.float32).tiny",
     "    return 0.01 * float(total.max()) / n + 0 * total"),
    ("03.average_gradients", "rank 0 only",
     "        for rank, result in enumerate(ranks):\n"
     "            if float((result[\"ddp\"]",
     "        for rank, result in enumerate(ranks[:1]):\n"
     "            if float((result[\"ddp\"]"),
    ("metrics.exact_val_loss", "rank 0 only",
     "    if any(abs(v - values[0]) > 2 * tolerance * abs(expected) or v != v for v in values):",
     "    if False:"),
    ("09.ring_all_reduce", "two ranks only",
     'names=("ring_all_reduce",)),', 'names=("ring_all_reduce",), world_sizes=(2,)),'),
    ("09.ring_all_reduce", "traffic not counted",
     "                       or _wrong_traffic(rank, case, n))", "                       )"),
    ("09.ring_all_reduce", "collectives allowed",
     "            message = (_wrong_call(case) or ", "            message = ("),
    ("10.sum_stats", "rank 0 only",
     "    for rank, result in enumerate(ranks):\n        got = result[\"got\"]",
     "    for rank, result in enumerate(ranks[:1]):\n        got = result[\"got\"]"),
    ("11.zero1_step", "two ranks only",
     'names=("zero1_step",),', 'names=("zero1_step",), world_sizes=(2,),'),
    ("11.zero1_step", "state not measured",
     "        if result[\"kept\"] != share:", "        if False:"),
    ("11.zero1_step", "ranks may disagree",
     "    if any(float((w - final[0]).abs().max()) > tolerance for w in final):",
     "    if False:"),
    ("09b.flat", "two ranks only", 'names=("FlatDDP",),', 'names=("FlatDDP",), world_sizes=(2,),'),
    ("09b.flat", "the start not compared",
     '        checks = (lambda run, result, rank: _wrong_start(run, ranks[0]["reference"], rank),',
     "        checks = (lambda run, result, rank: None,"),
    ("09b.flat", "the all-reduces not counted", "    if len(launches) > 1:", "    if False:"),
    ("09b.overlap", "two ranks only",
     'names=("OverlapDDP",),', 'names=("OverlapDDP",), world_sizes=(2,),'),
    ("09b.overlap", "blocking all-reduces allowed",
     "    blocking = [e for e in launches if not e[2]]\n    if blocking:\n"
     "        return _blocking(len(blocking), len(launches))\n"
     "    return _waited_in_backward(events) or _late_launches(events) or "
     "_kept_handles(events)\n",
     "    return _waited_in_backward(events) or _late_launches(events) or "
     "_kept_handles(events)\n"),
    ("09b.overlap", "handles not watched",
     '        message = message or _unwaited(events, run["events"])', "        message = message"),
    ("09b.overlap", "launches after backward allowed",
     "    if late:\n", "    if False:\n"),
    ("09b.buckets", "two ranks only",
     'names=("BucketDDP",),', 'names=("BucketDDP",), world_sizes=(2,),'),
    ("09b.buckets", "bucket sizes not compared", "    if got != want:", "    if False:"),
    ("09b.buckets", "launches after backward allowed",
     "    if late and sorted(got) == sorted(want):", "    if False:"),
    ("09b.buckets", "launches late in backward allowed",
     "    return (_waited_in_backward(events) or _late_buckets(events, expected)\n",
     "    return (_waited_in_backward(events)\n"),
    ("11.row_parallel", "two ranks only",
     'names=("row_parallel_forward",),', 'names=("row_parallel_forward",), world_sizes=(2,),'),
    ("11.row_parallel", "rank 0 only",
     "        for rank, cases in enumerate(ranks):\n            result = cases[index]",
     "        for rank, cases in enumerate(ranks[:1]):\n            result = cases[index]"),
    ("11.row_parallel", "collectives not watched",
     '            message = (_row_calls(result["seen"], case) or',
     "            message = (None or"),
]


def mutated(exercise_id: str, original: str, mutant: str):
    """The exercise as the mutated module defines it."""
    module = importlib.import_module(find(exercise_id).judge.__module__)
    source = inspect.getsource(module)
    assert source.count(original) == 1, f"the mutant's target is not in {module.__name__}"
    copy = types.ModuleType(module.__name__)
    copy.__dict__.update(__package__=module.__package__, __file__=module.__file__)
    exec(compile(source.replace(original, mutant), module.__file__, "exec"), copy.__dict__)
    return next(e for e in copy.EXERCISES if e.id == exercise_id)




def caught(exercise, verdicts) -> list:
    """Why test_checkers.py fails on these verdicts (empty: the mutant survives)."""
    failures = []
    for (kind, name, _), result in zip(answers(exercise), verdicts):
        if kind == "right" and result.status != CORRECT:
            failures.append(f"{name} rejected: {result.line}")
        elif kind == "mistake":
            mistake = exercise.mistakes[name]
            wrong_at = tuple(size for size, ok, _ in result.per_world_size if not ok)
            if (result.status == CORRECT or mistake.says not in result.message
                    or exercise.distributed and result.status == "wrong"
                    and wrong_at != exercise.wrong_at(name)):
                failures.append(f"{name} not rejected as catalogued: {result.line}")
    return failures


def _judge_here(exercise, body: str):
    def judged():
        with guarding(exercise.forbidden):
            return exercise.judge(run_cell(exercise, exercise.cell(body)))
    return verdict(exercise, judged)


@pytest.mark.parametrize("exercise", [e for e in exercises() if not e.distributed],
                         ids=lambda e: e.id)
def test_every_checker_passes_its_catalogue_judged_here(exercise):
    """The baseline the mutants are measured against: judged in this process, as they are,
    the unmutated checker accepts every right answer and names every mistake, as it does in
    the checker's own process (test_checkers.py). `mutmut run` ([tool.mutmut] in
    pyproject.toml) runs its mutants against this test."""
    verdicts = [_judge_here(exercise, body) for _, _, body in answers(exercise)]
    assert caught(exercise, verdicts) == []


def _found_since(exercise_id: str) -> list:
    """The wrong answers written after the catalogue (test_fresh_wrong_answers.py) and those
    once called correct (test_wrong_answers_once_told_correct.py): (name, source, says)."""
    return [(name, body, says) for found, name, body, *says in [*FRESH, *ONCE_TOLD]
            if found == exercise_id]


@pytest.mark.parametrize("exercise", [e for e in exercises()
                                      if not e.distributed and _found_since(e.id)],
                         ids=lambda e: e.id)
def test_every_wrong_answer_found_since_is_rejected_judged_here(exercise):
    """As their own tests judge them in the checker's processes, judged here: the second
    test `mutmut run` measures each mutant against, so that a hint no catalogued mistake
    reaches (a wrong answer the catalogue does not hold) is under test too."""
    for name, body, says in _found_since(exercise.id):
        result = _judge_here(exercise, body)
        assert result.status in (WRONG, ERROR) and len(result.message) > 30, (name, result.line)
        assert all(fragment in result.line for fragment in says), (name, result.line)


@pytest.mark.parametrize("exercise_id, weakens, original, mutant", MUTANTS,
                         ids=[f"{m[0]}: {m[1]}" for m in MUTANTS])
def test_each_mutant_of_a_checker_is_caught(exercise_id, weakens, original, mutant):
    exercise = mutated(exercise_id, original, mutant)
    verdicts = [_judge_here(exercise, body) for _, _, body in answers(exercise)]
    assert caught(exercise, verdicts), f"the mutant '{weakens}' survives"


@pytest.fixture(scope="module")
def launch(distributed_catalogue):
    """Every distributed exercise's answers, as the ranks returned them (the session's one
    launch, shared with test_checkers.py)."""
    return {exercise_id: [result for *_, result in entries]
            for exercise_id, entries in distributed_catalogue.items()}


@pytest.mark.slow
@pytest.mark.parametrize("exercise_id, weakens, original, mutant", DISTRIBUTED_MUTANTS,
                         ids=[f"{m[0]}: {m[1]}" for m in DISTRIBUTED_MUTANTS])
def test_each_mutant_of_a_distributed_judge_is_caught(exercise_id, weakens, original, mutant,
                                                      launch):
    exercise = mutated(exercise_id, original, mutant)
    original_exercise = find(exercise_id)
    assert caught(original_exercise, [judge_checked(original_exercise, result)
                                      for result in launch[exercise_id]]) == [], \
        "the checker itself must pass its catalogue"
    verdicts = [judge_checked(exercise, result) for result in launch[exercise_id]]
    assert caught(dataclasses.replace(exercise, world_sizes=original_exercise.world_sizes),
                  verdicts), f"the mutant '{weakens}' survives"


@pytest.mark.parametrize("exercise_id, weakens, original, mutant, why", SURVIVORS,
                         ids=[f"{m[0]}: {m[1]}" for m in SURVIVORS])
def test_the_survivors_survive_for_the_reason_given(exercise_id, weakens, original, mutant, why):
    exercise = mutated(exercise_id, original, mutant)
    verdicts = [_judge_here(exercise, body) for _, _, body in answers(exercise)]
    assert not caught(exercise, verdicts), f"'{weakens}' is caught now: move it to MUTANTS"
