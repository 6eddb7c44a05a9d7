"""Layers 1-2: prepare datasets (sources, flattening, sharded store) and read them by batch."""

# How FlattenedDataset holds shards: chosen by their size (auto), memory-mapped, copied to
# RAM, or copied to the training device (a GPU then gathers its own batches). Here, not in
# loading.py, so flags and configs can name them without importing torch.
MODES = ("auto", "efficient", "controlled", "device")
