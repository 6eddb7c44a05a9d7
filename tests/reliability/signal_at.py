"""trainup_cpu.py, whose training sends itself a signal at the step STOP_STEP says
(tests/reliability/stops.py): a SIGKILL that lands exactly where a test wants it."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[1])]

import kosmoss.run.train as train_module  # noqa: E402
import trainup_cpu  # noqa: E402
from stops import from_environment  # noqa: E402

if __name__ == "__main__":
    stop, build = from_environment(), train_module.build_trainer
    if stop is not None:
        train_module.build_trainer = lambda plan, callbacks: build(plan, callbacks + [stop])
    sys.argv[0] = "trainup_cpu.py"
    sys.exit(trainup_cpu.main())
