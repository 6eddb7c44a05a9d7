"""How kosmoss runs DDP: the options it gives torch's DistributedDataParallel."""
import inspect

from torch.nn.parallel import DistributedDataParallel

from kosmoss.devices.policy import sharing
from kosmoss.engines.ddp import DDPEngine, no_buffer_sync_per_step


def test_buffers_are_not_broadcast_before_every_forward_under_the_name_this_torch_takes():
    accepted = inspect.signature(DistributedDataParallel.__init__).parameters
    option = no_buffer_sync_per_step()
    assert list(option.values()) == [False] and set(option) <= set(accepted)
    if "forward_sync_buffers" in accepted:  # torch 2.13: the old name warns in every rank
        assert option == {"forward_sync_buffers": False}
    given = DDPEngine().strategy(sharing(2, 0), 2, None)._ddp_kwargs  # Lightning passes these on
    assert option.items() <= given.items() and given["gradient_as_bucket_view"]
