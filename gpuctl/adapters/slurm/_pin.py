"""Which data_parser gpuctl asks a Slurm release's `--json` for.

A plain `--json` prints what the release's newest data_parser plugin writes, so an upgrade of
Slurm changes the shape under gpuctl. From 23.11 the commands take the plugin to use
(`squeue --json=v0.0.42`), and a plugin's output stays the same in every release that ships it.
gpuctl pins the newest plugin that the release ships and that gpuctl's parser reads (`READS`).

What the table rests on: SchedMD's REST API client guide (slurm.schedmd.com/rest_clients.html,
"Data Parser Lifecycle", as of 25.11) gives each plugin's first release and the release that
removed it, and says a CLI can ask for one "starting with the v0.0.40 plugins": 23.02's `--json`
(v0.0.39) and 22.05's (openapi v0.0.38) take no plugin, so gpuctl pins none there. Slurm 26.05's
release notes add v0.0.45 and deprecate v0.0.42 (removed in 26.11). A release newer than 26.05
is read unpinned: gpuctl does not know which plugins it keeps.
"""

from __future__ import annotations

Release = tuple[int, int]  # (major, minor): 24.11 -> (24, 11)

# plugin -> (first release shipping it, first release without it; None: not announced)
LIFECYCLE: dict[str, tuple[Release, Release | None]] = {
    "v0.0.39": ((23, 2), (24, 11)),
    "v0.0.40": ((23, 11), (25, 11)),
    "v0.0.41": ((24, 5), (26, 5)),
    "v0.0.42": ((24, 11), (26, 11)),
    "v0.0.43": ((25, 5), (27, 5)),
    "v0.0.44": ((25, 11), (27, 11)),
    "v0.0.45": ((26, 5), None),
}
PIN_SINCE: Release = (23, 11)  # the first release whose commands take `--json=PLUGIN`
KNOWN_UNTIL: Release = (26, 5)  # the newest release the table knows
# The plugins whose shapes gpuctl's parser reads, checked against tests/fixtures/slurm/ (a
# recorded v0.0.42 node; constructed v0.0.40 nodes and v0.0.41 jobs).
READS = ("v0.0.40", "v0.0.41", "v0.0.42")


def shipped(release: Release) -> tuple[str, ...]:
    """The data_parser plugins `release` ships, oldest first (by the table)."""
    return tuple(
        p
        for p, (added, removed) in LIFECYCLE.items()
        if added <= release and (removed is None or release < removed)
    )


def pin_for(version: tuple[int, int, int]) -> tuple[str | None, str | None]:
    """(the plugin to pin, or None for a plain `--json`; a note for the reader, or None)."""
    release = (version[0], version[1])
    if release < PIN_SINCE:
        return None, None
    if release > KNOWN_UNTIL:
        return None, (
            f"Slurm {release[0]}.{release[1]:02d} is newer than gpuctl knows: reading its "
            "default JSON"
        )
    known = [p for p in shipped(release) if p in READS]
    if not known:  # cannot happen with the table above; read the default rather than fail
        return None, None
    return known[-1], None


def pinned(argv: list[str], plugin: str) -> list[str]:
    """`argv` with its `--json` asking for `plugin` (`--json=v0.0.42`), where it stands."""
    return [f"--json={plugin}" if a == "--json" else a for a in argv]


def refused(stderr: str, plugin: str) -> bool:
    """Whether a command's failure is its refusal of `plugin` (its stderr names the plugin:
    `data_parser_g_new: plugin v0.0.42 not found`)."""
    return plugin in stderr
