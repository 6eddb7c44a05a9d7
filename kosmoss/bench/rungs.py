"""The rungs of the GPU ladder (:mod:`kosmoss.bench.ladder`), in a module without torch:
the bench's matrix names a row per rung (:mod:`kosmoss.bench.setups`)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Tuple

from ..core.errors import UsageError


@dataclass(frozen=True)
class Rung:
    name: str
    removes: str  # what the change takes out of a step
    host_data: bool = False
    bf16: bool = False
    tf32: bool = False  # fp32 matmuls on TF32 tensor cores (torch's matmul precision "high")
    fused: bool = False
    compile: bool = False
    graphs: bool = False
    steps_per_replay: int = 1
    bf16_store: bool = False  # inputs held on the device normalised, in bfloat16

    @property
    def needs_cuda(self) -> bool:
        return self.graphs or self.host_data or self.tf32  # TF32 is a CUDA matmul mode

    @property
    def arithmetic(self) -> str:
        """The format the matmuls run in, which sets the peak this rung can reach."""
        return "bf16" if self.bf16 else "tf32" if self.tf32 else "fp32"


def _ladder() -> Tuple[Rung, ...]:
    host = Rung("host", "nothing yet: host gather, pinned copy to the GPU", host_data=True)
    resident = replace(host, name="resident", removes="host-to-device copies of the batch",
                       host_data=False)
    bf16 = replace(resident, name="bf16", removes="fp32 arithmetic: tensor cores in bf16",
                   bf16=True)
    fused = replace(bf16, name="fused", removes="Adam's per-parameter kernels", fused=True)
    compiled = replace(fused, name="compile", removes="separate elementwise kernels",
                       compile=True)
    graphs = replace(compiled, name="graphs", removes="Python and kernel launches per step",
                     graphs=True)
    several = replace(graphs, name="graphs-k8", removes="one replay per step",
                      steps_per_replay=8)
    stored = replace(several, name="bf16-store", bf16_store=True,
                     removes="the per-step normalisation and bf16 cast of every input batch")
    return (host, resident, bf16, fused, compiled, graphs, several, stored)


RUNGS = _ladder()
TOP = RUNGS[-1]  # kosmoss-gpu-top is set against this rung (the same features)
# Off the ladder: the eager fp32 loop plus torch.compile alone (the CPU bench's compile row),
# and plus TF32 matmuls alone (fp32's own tensor-core path, beside bf16's).
COMPILE_ALONE = Rung("compile-fp32", "separate elementwise kernels, eager fp32 otherwise",
                     compile=True)
TF32_ALONE = Rung("tf32", "fp32 matmuls on CUDA cores: TF32 tensor cores instead", tf32=True)
OFF_LADDER = (COMPILE_ALONE, TF32_ALONE)
RUNG_NAMES = tuple(r.name for r in RUNGS + OFF_LADDER)


def rung(name: str) -> Rung:
    for candidate in RUNGS + OFF_LADDER:
        if candidate.name == name:
            return candidate
    raise UsageError(f"--rungs {name}: no such rung; choose from {', '.join(RUNG_NAMES)}")
