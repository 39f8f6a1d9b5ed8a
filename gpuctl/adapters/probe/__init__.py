"""The NVML probe: one constant `sh` script per node per poll, and its pure parser.

`probe_command()` is what gather runs on a node; `parse_probe()` turns its stdout into an
`Observation`. Both are pure (no I/O, no paramiko): the parser is importable anywhere.
`gpuctl.adapters.probe.local` is the `transport: local` probe through pynvml.
"""

from gpuctl.adapters.probe.nvsmi import (
    MAX_PROBE_BYTES,
    parse_probe,
    parse_versions,
    parse_xid_line,
    parse_xid_lines,
    same_pci_device,
)
from gpuctl.adapters.probe.script import probe_command, probe_program

__all__ = [
    "MAX_PROBE_BYTES",
    "parse_probe",
    "parse_versions",
    "parse_xid_line",
    "parse_xid_lines",
    "probe_command",
    "probe_program",
    "same_pci_device",
]
