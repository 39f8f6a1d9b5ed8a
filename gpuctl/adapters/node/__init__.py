"""Jobs on nodes: `SshJobRunner`, the `JobRunner` protocol of `gpuctl.adapters.protocols` over any
`Transport`, next to the `sh` scripts it sends and the parsers of what they print.

This front re-exports the runner and its errors. The pieces are private: the runner (`_runner`),
the launch script (`_launch`), the scripts that watch, signal, fence and read a job's runs
(`_runs`), the checkpoint scripts (`_checkpoints`) and what every script shares (`_script`: the
command line with its stdin, `~`, the lines a script marks in its output). The scripts are PURE:
text in, text out; only the runner talks to a node.
"""

from __future__ import annotations

from gpuctl.adapters.node._runner import (
    CheckpointCopyError,
    LaunchFailed,
    LaunchRefused,
    RunNotFound,
    SshJobRunner,
    verify_local,
)

__all__ = [
    "CheckpointCopyError",
    "LaunchFailed",
    "LaunchRefused",
    "RunNotFound",
    "SshJobRunner",
    "verify_local",
]
