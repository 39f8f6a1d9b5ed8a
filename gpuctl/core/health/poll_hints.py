"""Health hints for `gpuctl status`: short facts an operator should notice, per node and per GPU.

Not the health verdict (the rules as data: `core/health.py`): only what the last poll shows.
"""

from __future__ import annotations

from gpuctl.core.model import GpuSnapshot, NodeSnapshot

HOT_C = 85
CLOCK_SKEW_S = 30  # a node clock this far from gpuctl's: checkpoint ages and fencing times drift


def gpu_hints(gpu: GpuSnapshot) -> tuple[str, ...]:
    out: list[str] = []
    if gpu.ecc_volatile_uncorrected:
        out.append(f"ECC uncorrected {gpu.ecc_volatile_uncorrected}")
    if gpu.retired_pages_pending:
        out.append("retired page pending")
    if gpu.remapped_rows_failure:
        out.append("row remap failed")
    elif gpu.remapped_rows_pending:
        out.append("row remap pending")
    if gpu.temp_c is not None and gpu.temp_c >= HOT_C:
        out.append(f"hot {gpu.temp_c}C")
    if gpu.thermal_slowdown_hw or gpu.thermal_slowdown_sw:
        out.append("thermal slowdown")
    if gpu.mig_mode:
        out.append("MIG")
    return tuple(out)


def node_hints(node: NodeSnapshot, expected_gpus: int | None = None) -> tuple[str, ...]:
    obs = node.observation
    if obs is None:
        return ()
    out: list[str] = []
    if expected_gpus is not None and len(obs.gpus) < expected_gpus:
        out.append(f"{expected_gpus - len(obs.gpus)} GPU missing (expects {expected_gpus})")
    xids = sorted({x.xid for x in obs.xids})
    if xids:
        out.append("XID " + ",".join(str(x) for x in xids))
    for gpu in obs.gpus:
        out.extend(f"gpu{gpu.index}: {h}" for h in gpu_hints(gpu))
    skew = node.clock_offset_s
    if skew is not None and abs(skew) > CLOCK_SKEW_S:
        out.append(f"clock {abs(skew):.0f} s {'ahead' if skew > 0 else 'behind'}")
    if obs.notes and obs.nvml_ok:
        out.append(f"{len(obs.notes)} parse note(s)")
    return tuple(out)
