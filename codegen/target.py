"""Compilation targets: what the code generator may assume about the machine it compiles for.

A target names an architecture (``sm_100a``, ``sm_90a``, or ``cpu``), the features kernel rules
test for (tcgen05, wgmma, TMA, FP8/FP4 tensor cores), and the sizes that capacity planning and
roofline reports need (SMs, shared memory, HBM size and bandwidth). Figures are the vendors'
datasheet values for the SXM parts; the H200's measured copy bandwidth is in ``shared/GPU.md``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """One machine kind. ``arch`` is what NVRTC/nvcc get (``sm_90a``), ``None`` for the CPU."""

    name: str
    arch: str | None
    #: compute capability as an int (90, 100); 0 for the CPU
    sm: int = 0
    tcgen05: bool = False
    wgmma: bool = False
    tma: bool = False
    fp8_tensor_cores: bool = False
    fp4_tensor_cores: bool = False
    num_sms: int = 0
    #: the most dynamic shared memory one block may opt into, and the total per SM
    smem_per_block: int = 0
    smem_per_sm: int = 0
    hbm_bytes: int = 0
    hbm_bytes_per_s: float = 0.0
    #: dense tensor-core peaks (FLOP/s), for roofline reports
    bf16_flops: float = 0.0
    fp8_flops: float = 0.0

    @property
    def is_gpu(self) -> bool:
        return self.arch is not None

    @property
    def arch_family(self) -> str:
        """The template key: ``sm90`` or ``sm100`` (kernel folders hold one template per key)."""
        if self.arch is None:
            raise ValueError(f"target {self.name!r} has no GPU architecture")
        return f"sm{self.sm}"

    def features(self) -> list[str]:
        names = ("tcgen05", "wgmma", "tma", "fp8_tensor_cores", "fp4_tensor_cores")
        return [n for n in names if getattr(self, n)]


_GiB = 1 << 30

B200 = Target(
    name="b200", arch="sm_100a", sm=100, tcgen05=True, wgmma=False, tma=True,
    fp8_tensor_cores=True, fp4_tensor_cores=True, num_sms=148,
    smem_per_block=227 * 1024, smem_per_sm=228 * 1024,
    hbm_bytes=180 * _GiB, hbm_bytes_per_s=8.0e12, bf16_flops=2.25e15, fp8_flops=4.5e15,
)
H200 = Target(
    name="h200", arch="sm_90a", sm=90, wgmma=True, tma=True, fp8_tensor_cores=True, num_sms=132,
    smem_per_block=227 * 1024, smem_per_sm=228 * 1024,
    hbm_bytes=141 * 10**9, hbm_bytes_per_s=4.8e12, bf16_flops=989e12, fp8_flops=1979e12,
)
H100 = Target(
    name="h100", arch="sm_90a", sm=90, wgmma=True, tma=True, fp8_tensor_cores=True, num_sms=132,
    smem_per_block=227 * 1024, smem_per_sm=228 * 1024,
    hbm_bytes=80 * _GiB, hbm_bytes_per_s=3.35e12, bf16_flops=989e12, fp8_flops=1979e12,
)
CPU = Target(name="cpu", arch=None)

TARGETS: dict[str, Target] = {t.name: t for t in (B200, H200, H100, CPU)}


def get_target(name: str | Target) -> Target:
    """The target called ``name`` (case-insensitive); a ``Target`` passes through."""
    if isinstance(name, Target):
        return name
    try:
        return TARGETS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; known targets: {', '.join(TARGETS)}") from None


def gpu_targets() -> list[Target]:
    return [t for t in TARGETS.values() if t.is_gpu]
