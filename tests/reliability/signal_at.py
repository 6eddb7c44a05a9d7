"""trainup_cpu.py, whose training sends itself a signal at the step STOP_STEP says
(tests/reliability/stops.py): a SIGKILL that lands exactly where a test wants it."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[1])]

from stops import from_environment, trainup_with  # noqa: E402

if __name__ == "__main__":
    stop = from_environment()
    sys.argv[0] = "trainup_cpu.py"  # the ranks Lightning starts run trainup_cpu.py, unsignalled
    sys.exit(trainup_with(stop))
