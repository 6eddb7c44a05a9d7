import math

import pytest

from kosmoss.core.errors import ConfigError, UsageError
from kosmoss.run.flags import in_flag_terms
from kosmoss.scaling.arithmetic import plan


def test_per_device_batch_and_linear_rule():
    p = plan(512, 1e-3, "linear", devices_per_node=2, num_nodes=2)
    assert (p.world_size, p.per_device_batch_size, p.base_batch_size) == (4, 128, 128)
    assert p.lr == pytest.approx(4e-3) and p.lr_factor == 4


def test_sqrt_rule_and_explicit_base_batch():
    p = plan(1024, 0.01, "sqrt", devices_per_node=2, base_batch_size=64)
    assert p.lr == pytest.approx(0.01 * math.sqrt(1024 / 64))


def test_none_keeps_the_rate():
    assert plan(256, 0.5, "none", devices_per_node=4).lr == 0.5


@pytest.mark.parametrize("batch, lr, rule, match", [
    (101, 1e-3, "none", "not divisible"),
    (1, 1e-3, "none", "smaller than the world size"),
    (100, 0.0, "none", "^lr 0.0"),
    (100, -1.0, "none", "^lr -1.0"),
    (100, 1e-3, "cubic", "^scale_lr 'cubic'"),
])
def test_bad_numbers_name_the_field(batch, lr, rule, match):
    """The core names the configuration field; the launchers render it as their flag."""
    with pytest.raises(ConfigError, match=match) as caught:
        plan(batch, lr, rule, devices_per_node=2)
    assert in_flag_terms(caught.value).startswith("--")


def test_arithmetic_is_printed_in_full():
    text = "\n".join(plan(256, 1e-3, "linear", devices_per_node=2).lines())
    assert "256 / 2 = 128" in text and "x 2 (linear) = 0.002" in text


def test_warmup_ramps_from_the_base_rate_to_the_scaled_rate():
    from kosmoss.scaling.arithmetic import warmup_factor

    p = plan(512, 1e-3, "linear", devices_per_node=4, warmup_steps=10)
    start = p.base_lr / p.lr
    factors = [warmup_factor(step, p.warmup_steps, start) for step in (0, 5, 10, 50)]
    assert [p.lr * f for f in factors] == pytest.approx([1e-3, 2.5e-3, 4e-3, 4e-3])
    assert "linear from 0.001 to 0.004 over 10 steps" in "\n".join(p.lines())
    with pytest.raises(UsageError, match="^warmup_steps -1"):
        plan(512, 1e-3, "linear", devices_per_node=4, warmup_steps=-1)
