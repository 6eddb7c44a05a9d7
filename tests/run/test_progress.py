"""With K optimizer steps per step of Lightning's loop, the progress bar counts batches
(26/26 for the tiny preset at batch 64), not loop steps (4/4); and a run prints no warning."""
import io
import os
import re
import subprocess
import sys

import pytorch_lightning as pl
from helpers import REPO

from kosmoss.run.callbacks import BatchesProgressBar
from kosmoss.run.chunks import StepsInChunks
from kosmoss.run.datamodule import RunDataModule


def test_the_bar_counts_batches_when_a_loop_step_holds_eight(random_dataset):
    screen = io.StringIO()
    bar = BatchesProgressBar(console_kwargs={"file": screen, "force_terminal": True,
                                             "width": 200})
    model = StepsInChunks(random_dataset.n_x, (8,), random_dataset.n_y,
                          stats=random_dataset.statistics())
    data = RunDataModule(random_dataset, batch_size=64, seed=1, steps_per_execution=8)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=[bar],
                         logger=False, enable_checkpointing=False, enable_model_summary=False,
                         use_distributed_sampler=False, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=data)
    batches = data.train_batches_per_epoch()  # 13 batches of 64 in 800 rows: 2 loop steps
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", screen.getvalue())
    assert f" {batches}/{batches} " in text and trainer.num_training_batches == 2, text[-500:]
    assert " 2/2 " not in text.split("Validation")[0]


def test_a_run_prints_no_warning(shared_home):
    for k in ("1", "8"):
        env = {**os.environ, "KOSMOSS_HOME": str(shared_home)}
        done = subprocess.run([sys.executable, "trainup_cpu.py", "--dataset", "tiny", "--hidden",
                               "16", "--batch-size", "64", "--max-steps", "30",
                               "--steps-per-execution", k], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "Warning" not in done.stdout + done.stderr, done.stderr[-3000:]
