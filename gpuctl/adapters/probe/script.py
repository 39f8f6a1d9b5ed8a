"""The node probe: one constant POSIX `sh` script, run with one remote exec per node per poll.

The script prints delimited sections. Its first line is `@@gpuctl-probe 1 <marker>`, where the
marker is random hex made on the node at run time, so nothing a process prints (a process name,
a kernel log line) can forge a section boundary. Each section is

    @@<marker> begin <name>
    ...the command's stdout...
    @@<marker> stderr <name>      (only when the command wrote to stderr; first 4096 bytes)
    ...
    @@<marker> end <name> rc=<exit status, or "skip">

Every `nvidia-smi` call runs under coreutils `timeout` when the node has it; after one call times
out (or `nvidia-smi` is not installed) the remaining calls are skipped (`rc=skip`), so a hung
driver costs one step timeout, not one per query. The transport enforces the overall deadline;
since every step is bounded, the script starts with `SELF_BOUNDED` and the SSH transport runs it
without a `timeout` backstop of its own.

Nothing variable is interpolated into the script except `step_timeout_s`, an int checked here.
"""

from __future__ import annotations

from gpuctl.adapters.exec_wrapper import SELF_BOUNDED

PROBE_VERSION = "1"
HEADER_PREFIX = "@@gpuctl-probe "

# Fields every driver gpuctl supports answers (R4xx and later): one query, one row per GPU.
GPU_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "driver_version",
    "memory.total",
    "memory.used",
    "utilization.gpu",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "ecc.mode.current",
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.aggregate.total",
    "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.single_bit_ecc.count",
    "retired_pages.double_bit.count",
    "retired_pages.pending",
)

# Newer fields (MIG, row remapping: R450+; the thermal slowdown split). They are asked for in the
# same query (one nvidia-smi run per poll: each run initialises NVML, which is slow on real nodes).
# A driver that rejects any one field fails the whole query; the script then asks again in two
# queries joined on index, so an older driver loses only these, never the GPU list.
# `clocks_throttle_reasons.*` is the old name, still accepted as an alias of
# `clocks_event_reasons.*` by current drivers (590, 595 help text).
GPU_HEALTH_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "mig.mode.current",
    "remapped_rows.correctable",
    "remapped_rows.uncorrectable",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "clocks_throttle_reasons.hw_thermal_slowdown",
    "clocks_throttle_reasons.sw_thermal_slowdown",
)

# process_name last: it is the only field that can contain a comma.
APP_FIELDS: tuple[str, ...] = ("gpu_uuid", "pid", "used_memory", "process_name")

XID_TAIL_LINES = 50

SECTION_FACTS = "facts"
SECTION_GPU = "gpu"
SECTION_GPU_HEALTH = "gpu-health"
SECTION_APPS = "apps"
SECTION_VERSION = "version"
SECTION_XID = "xid"
SECTION_BANNER = "banner"  # plain `nvidia-smi`, only when `--version` is refused (old drivers)

_TEMPLATE = r"""@BOUNDED@LC_ALL=C; export LC_ALL
m=
if read -r u < /proc/sys/kernel/random/uuid 2>/dev/null; then
  o=$IFS; IFS=-; set -- $u; IFS=$o; m="$1$2$3$4$5"
fi
[ -n "$m" ] || m=$(od -An -N8 -tx1 /dev/urandom 2>/dev/null | tr -dc 0-9a-f)
[ -n "$m" ] || m="p$$x$(date +%s 2>/dev/null)"
GPUCTL_PROBE_RUN=$m; export GPUCTL_PROBE_RUN  # one name per run for the tools it starts
O="@@gpuctl-probe @VERSION@ $m
"
t=""
if command -v timeout >/dev/null 2>&1; then t="timeout -k 2 @STEP@"; fi
skip=0
out() { printf '%s' "$O"; O=; }  # what the shell printed itself goes out in one write
begin() { O="$O
@@$m begin $1
"; }
end() { O="$O
@@$m end $1 rc=$2
"; }
sec() {
  n=$1; shift
  begin "$n"; out
  { err=$("$@" 2>&1 1>&3 3>&-); rc=$?; } 3>&1
  if [ -n "$err" ]; then printf '\n@@%s stderr %s\n%.4096s\n' "$m" "$n" "$err"; fi
  end "$n" "$rc"
}
nv() {
  if [ "$skip" = 1 ]; then rc=skip; begin "$1"; end "$1" skip; return 0; fi
  n=$1; shift
  sec "$n" $t nvidia-smi "$@"
  case $rc in 124|137|126|127) skip=1 ;; esac
}
facts() {
  if read -r h < /proc/sys/kernel/hostname; then :; else h=$(uname -n); fi
  O="${O}hostname=$h
clock_s=$(date +%s)
"
@CPU@
  if [ -r /proc/meminfo ]; then  # MemAvailable is the third line: read no further
    while read -r k v rest; do
      case $k in
        MemTotal:) O="$O$k $v $rest
" ;;
        MemAvailable:) O="$O$k $v $rest
"; break ;;
      esac
    done < /proc/meminfo
  fi
}
xa='index($0, "NVRM: Xid") { l[n++ % @XIDTAIL@] = $0 }
END {
  if (NR == 0) exit 1
  print "source=" s
  for (i = (n > @XIDTAIL@ ? n - @XIDTAIL@ : 0); i < n; i++) print l[i % @XIDTAIL@]
}'
xid() {  # the last XID lines of dmesg (no output: refused), else of journalctl -k
  dmesg | awk -v s=dmesg "$xa" && return 0
  if r=$($t journalctl -k -q --no-pager -o short-monotonic -n 20000); then
    printf '%s\n' "$r" | awk -v s=journalctl "$xa" && return 0
  fi
  echo "source=none"
}
begin @FACTS@; facts 2>/dev/null; end @FACTS@ 0
nv @GPU@ --query-gpu=@GPUFIELDS@,@HEALTHONLY@ --format=csv,nounits
case $rc in
  0|skip|124|137|126|127) ;;
  *) # an older driver refused a field: ask for the health fields apart (a later section wins)
    nv @GPU@ --query-gpu=@GPUFIELDS@ --format=csv,nounits
    nv @HEALTH@ --query-gpu=@HEALTHFIELDS@ --format=csv,nounits ;;
esac
nv @APPS@ --query-compute-apps=@APPFIELDS@ --format=csv,nounits
@VERSIONS@begin @XID@; out; xid 2>/dev/null; end @XID@ 0
O="$O
@@$m done
"; out
exit 0
"""


_CPU = """  O="${O}cpu_count=$(getconf _NPROCESSORS_ONLN || nproc)
"
"""
_VERSIONS = """nv @VERSION_SECTION@ --version
case $rc in 0|skip) ;; *) nv @BANNER@ ;; esac
"""


def probe_command(*, step_timeout_s: int = 5, static_facts: bool = True) -> str:
    """The one script gpuctl runs on a node per poll. Constant text: no node data goes in.

    `static_facts=False` leaves out what does not change between polls (driver and CUDA versions,
    CPU count): one `nvidia-smi` run fewer (each initialises NVML) for polls of a node whose
    static facts the caller already knows.
    """
    if (
        isinstance(step_timeout_s, bool)
        or not isinstance(step_timeout_s, int)
        or not 1 <= step_timeout_s <= 600
    ):
        raise ValueError(f"step_timeout_s must be an int from 1 to 600, got {step_timeout_s!r}")
    script = _TEMPLATE.replace("@CPU@\n", _CPU if static_facts else "")
    script = script.replace("@VERSIONS@", _VERSIONS if static_facts else "")
    for key, value in (
        ("@BOUNDED@", SELF_BOUNDED),  # the transport needs no backstop timeout around it
        ("@VERSION@", PROBE_VERSION),
        ("@STEP@", str(step_timeout_s)),
        ("@XIDTAIL@", str(XID_TAIL_LINES)),
        ("@FACTS@", SECTION_FACTS),
        ("@GPU@", SECTION_GPU),
        ("@HEALTH@", SECTION_GPU_HEALTH),
        ("@APPS@", SECTION_APPS),
        ("@VERSION_SECTION@", SECTION_VERSION),
        ("@XID@", SECTION_XID),
        ("@BANNER@", SECTION_BANNER),
        ("@GPUFIELDS@", ",".join(GPU_FIELDS)),
        ("@HEALTHFIELDS@", ",".join(GPU_HEALTH_FIELDS)),
        ("@HEALTHONLY@", ",".join(f for f in GPU_HEALTH_FIELDS if f not in GPU_FIELDS)),
        ("@APPFIELDS@", ",".join(APP_FIELDS)),
    ):
        script = script.replace(key, value)
    return script


def frame_probe_output(
    sections: list[tuple[str, bytes, bytes, int | str]],
    *,
    marker: str = "0123456789abcdef",
    done: bool = True,
) -> bytes:
    """Probe output framed exactly as the script frames it: (name, stdout, stderr, rc) each.

    For tests and fakes (a scripted transport can answer `probe_command()` with this).
    """
    out = [f"@@gpuctl-probe {PROBE_VERSION} {marker}\n".encode()]
    for name, stdout, stderr, rc in sections:
        out.append(f"\n@@{marker} begin {name}\n".encode())
        out.append(stdout)
        if stderr:
            out.append(f"\n@@{marker} stderr {name}\n".encode() + stderr[:4096] + b"\n")
        out.append(f"\n@@{marker} end {name} rc={rc}\n".encode())
    if done:
        out.append(f"\n@@{marker} done\n".encode())
    return b"".join(out)


def probe_program(*, step_timeout_s: int = 5) -> str:
    """The probe for a node's answering session (`Transport.ask`): asked `full` it runs
    `probe_command()`, asked anything else the light one (`static_facts=False`). Constant text."""
    full = probe_command(step_timeout_s=step_timeout_s).removeprefix(SELF_BOUNDED)
    light = probe_command(step_timeout_s=step_timeout_s, static_facts=False)
    light = light.removeprefix(SELF_BOUNDED)
    return f"{SELF_BOUNDED}case $1 in\nfull)\n{full}\n;;\n*)\n{light}\n;;\nesac\n"
