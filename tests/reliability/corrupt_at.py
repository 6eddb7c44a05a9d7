"""trainup_cpu.py, one of whose ranks trains on an inf batch at the step CORRUPT_STEP says
(tests/reliability/corruption.py)."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[1])]

import kosmoss.run.train as train_module  # noqa: E402
import trainup_cpu  # noqa: E402
from corruption import from_environment  # noqa: E402

if __name__ == "__main__":
    corrupt, build = from_environment(), train_module.build_trainer
    if corrupt is not None:
        train_module.build_trainer = lambda plan, callbacks: build(plan, callbacks + [corrupt])
    sys.exit(trainup_cpu.main())
