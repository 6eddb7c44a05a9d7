"""trainup_cpu.py, one of whose ranks trains on an inf batch at the step CORRUPT_STEP says
(tests/reliability/corruption.py); its host reads late as on a GPU where the environment
asks (late_reads.py, through trainup_with). Every rank Lightning starts runs this script too."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[1])]

from corruption import from_environment  # noqa: E402
from stops import trainup_with  # noqa: E402

if __name__ == "__main__":
    sys.exit(trainup_with(from_environment()))
