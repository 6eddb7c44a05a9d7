"""Distributed engines kosmoss adds to Lightning: Horovod (``kosmoss.engines.horovod``).

DDP needs nothing here: Lightning's DDPStrategy over torch.distributed does it all.
"""
