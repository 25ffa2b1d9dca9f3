"""The TPU chips the judge can target, with the public figures the roofline needs."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    topology: str             # an AOT topology libtpu 0.0.42 accepts (1x1 is refused there)
    accelerator_type: str     # TPU_ACCELERATOR_TYPE that quiets libtpu's start-up on a CPU host
    clock_hz: float           # turns the compiler's cycle estimate into seconds
    peak_flops: float         # bf16 FLOP/s per chip
    hbm_bytes_per_s: float
    vmem_bytes: int
    default_scoped_vmem_bytes: int
    tensorcores: int          # per chip: "parallel" grid axes are shared among them
    device_kind: str          # what jax.devices()[0].device_kind says on such a chip


# Peak FLOP/s and HBM bandwidth: Google Cloud TPU documentation. Clocks: v5e 1.5 GHz
# (197 TFLOP/s from 4 MXUs of 128x128); v6e 1.75 GHz is an approximation; v5p 1.75 GHz is what its
# 459 TFLOP/s takes from two TensorCores of 4 MXUs of 128x128 each (jax's tpu_info: 4 MXUs and 64 MiB
# of VMEM per v5p core; the scoped default, 16 MiB, is Mosaic's before v6). Cycle-derived
# latencies are therefore approximate in absolute terms; speedups (ratios of estimates on one
# chip and one libtpu version) are not affected by the clock. TensorCores per chip: one on v5e and
# v6e (Cloud TPU system architecture pages; v4 and v5p have two). Device kinds: what JAX reports
# on those chips, by which production kernels look their tuned tables up (JAX's RPA, megablox).
CHIPS: dict[str, Chip] = {
    "v5e": Chip("v5e", "v5e:2x2", "v5litepod-4", 1.5e9, 197e12, 819e9, 128 << 20, 16 << 20, 1, "TPU v5 lite"),
    "v6e": Chip("v6e", "v6e:2x2", "v6e-4", 1.75e9, 918e12, 1638e9, 128 << 20, 32 << 20, 1, "TPU v6 lite"),
    "v5p": Chip("v5p", "v5p:2x2x1", "v5p-8", 1.75e9, 459e12, 2765e9, 64 << 20, 16 << 20, 2, "TPU v5"),
}


def get_chip(name: str) -> Chip:
    try:
        return CHIPS[name]
    except KeyError:
        raise ValueError(f"unknown chip {name!r}; choose one of: {', '.join(CHIPS)}") from None


def answer_cpu_as(device_kind: str) -> None:
    """Off a TPU host, Pallas' table of a chip's sizes answers for the CPU device as for the chip
    of ``device_kind`` (the chip judged): what ``pltpu.emit_pipeline`` reads at trace time, and
    what some ops' lowering asks of the default device ("Unsupported TPU device kind: cpu")."""
    from jax._src.pallas.mosaic import tpu_info

    version = tpu_info.chip_version_from_device_kind(device_kind)
    if version is not None:
        tpu_info.registry.setdefault("cpu", lambda: tpu_info.get_tpu_info_for_chip(version, 1))
