"""Gather: one probe per node, a snapshot per node whatever happens to the others."""

import threading
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import ExecResult
from gpuctl.core.model import NodeSpec, NodeState, Observation, Reach
from gpuctl.errors import (
    AuthFailed,
    ConnectRefused,
    HostKeyUnknown,
    TransportTimeout,
)
from gpuctl.lab import node_tools, nodestate
from gpuctl.ops.gather import Gatherer
from gpuctl.testing.fakes import FakeTransport, ShellTransport


def _node(name: str, **kw: object) -> NodeSpec:
    return NodeSpec(name=name, host="127.0.0.1", port=22, **kw)  # type: ignore[arg-type]


@pytest.fixture
def fake_node(tmp_path: Path) -> dict[str, str]:
    """A node environment with the lab's fake nvidia-smi and dmesg and 4 idle L40S cards."""
    state = tmp_path / "state.json"
    nodestate.write_state(
        state, nodestate.new_node_state("n1", gpus=4, model="NVIDIA L40S", mem_gib=48, node_index=0)
    )
    node_tools.install_node_tools(tmp_path / "bin", python="/usr/bin/python3")
    return {
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "GPUCTL_LAB_STATE": str(state),
        "GPUCTL_LAB_NODE": "n1",
    }


def test_a_node_that_answers_is_ready_with_its_gpus(fake_node: dict[str, str]) -> None:
    with Gatherer(ShellTransport({"n1": fake_node})) as gatherer:
        fleet = gatherer.gather([_node("n1", labels={"pool": "a"})])
    (node,) = fleet.nodes
    assert node.reach is Reach.OK
    assert node.state is NodeState.READY
    assert node.error is None
    assert [g.index for g in node.gpus] == [0, 1, 2, 3]
    assert {g.model for g in node.gpus} == {"NVIDIA L40S"}
    assert all(g.mem_total_mib == 46068 for g in node.gpus)
    assert dict(node.labels) == {"pool": "a"}
    assert node.observation is not None
    assert node.observation.facts.driver_version == "590.48.01"


def test_every_node_gets_its_own_outcome_in_inventory_order(fake_node: dict[str, str]) -> None:
    shell = ShellTransport({"ok": fake_node})
    failures = {
        "refused": ConnectRefused("refused: sshd is not running"),
        "slow": TransportTimeout("timeout (connect) after 5s"),
        "badkey": AuthFailed("the key was not accepted"),
        "stranger": HostKeyUnknown("unknown host key SHA256:abc", hint="gpuctl hosts trust x"),
    }

    def answer(node: NodeSpec, command: str) -> ExecResult:
        return shell.run(node, command, timeout_s=10)

    fake = FakeTransport({"ok": answer, **failures})
    names = ["refused", "ok", "slow", "badkey", "stranger"]
    with Gatherer(fake) as gatherer:
        fleet = gatherer.gather([_node(n) for n in names])
    assert [n.name for n in fleet.nodes] == names
    by = {n.name: n for n in fleet.nodes}
    assert by["ok"].reach is Reach.OK and by["ok"].state is NodeState.READY
    assert by["refused"].reach is Reach.REFUSED
    assert by["slow"].reach is Reach.TIMEOUT
    assert by["badkey"].reach is Reach.AUTH_FAILED
    assert by["stranger"].reach is Reach.HOST_KEY
    for name in ("refused", "slow", "badkey", "stranger"):
        assert by[name].state is NodeState.DOWN
        assert by[name].error == failures[name].message
        assert by[name].observation is None
    assert len(fake.calls) == len(names)  # one exec per node per poll


def test_unparseable_output_makes_the_node_unknown_not_down() -> None:
    garbage = ExecResult(exit_code=0, stdout=b"\x1b[31m\xff\xfegarbage", stderr=b"", duration_s=0)
    with Gatherer(FakeTransport({"g": garbage})) as gatherer:
        (node,) = gatherer.gather([_node("g")]).nodes
    assert node.reach is Reach.OK
    assert node.state is NodeState.UNKNOWN
    assert node.error
    assert "\x1b" not in node.error


def test_a_surprise_on_one_node_does_not_stop_the_scan(fake_node: dict[str, str]) -> None:
    shell = ShellTransport({"ok": fake_node})

    def broken(node: NodeSpec, command: str) -> ExecResult:
        raise RuntimeError("boom")

    fake = FakeTransport({"ok": lambda n, c: shell.run(n, c, timeout_s=10), "broken": broken})
    with Gatherer(fake) as gatherer:
        fleet = gatherer.gather([_node("broken"), _node("ok")])
    assert [n.reach for n in fleet.nodes] == [Reach.ERROR, Reach.OK]
    assert fleet.nodes[0].error == "RuntimeError: boom"


def test_progress_is_reported_once_per_node(fake_node: dict[str, str]) -> None:
    seen: list[tuple[str, int, int]] = []
    fake = FakeTransport({"a": ConnectRefused("x"), "b": ConnectRefused("y")})
    with Gatherer(fake) as gatherer:
        gatherer.gather(
            [_node("a"), _node("b")], progress=lambda s, d, t: seen.append((s.name, d, t))
        )
    assert sorted(n for n, _, _ in seen) == ["a", "b"]
    assert sorted(d for _, d, _ in seen) == [1, 2]
    assert {t for _, _, t in seen} == {2}


def test_a_local_node_is_probed_without_the_transport() -> None:
    fake = FakeTransport({})
    with Gatherer(fake, local_probe=lambda: Observation(nvml_ok=False, notes=("no driver",))) as g:
        (node,) = g.gather([_node("here", transport="local")]).nodes
    assert fake.calls == []
    assert node.state is NodeState.UNKNOWN
    assert node.error == "no driver"


def test_a_hung_local_nvml_probe_times_out_instead_of_hanging_the_scan() -> None:

    release = threading.Event()

    def hung() -> Observation:
        release.wait(30)
        raise RuntimeError("released")

    with Gatherer(FakeTransport({}), local_probe=hung) as g:
        (node,) = g.gather([_node("here", transport="local", command_timeout_s=0.2)]).nodes
    release.set()
    assert node.reach is Reach.TIMEOUT
    assert node.error == "local NVML probe did not answer within 0.2s"


def test_warm_polls_skip_the_static_facts_but_still_report_them(fake_node: dict[str, str]) -> None:
    shell = ShellTransport({"n1": fake_node})
    with Gatherer(shell) as gatherer:
        first = gatherer.gather([_node("n1")]).nodes[0]
        second = gatherer.gather([_node("n1")]).nodes[0]
    (_, full), (_, light) = shell.calls
    assert "--version" in full and "_NPROCESSORS_ONLN" in full
    assert "--version" not in light and "_NPROCESSORS_ONLN" not in light
    assert first.observation is not None and second.observation is not None
    assert second.observation.facts.cuda_version == first.observation.facts.cuda_version == "13.1"
    assert second.observation.facts.cpu_count == first.observation.facts.cpu_count
    assert second.observation.facts.driver_version == "590.48.01"


def test_a_new_driver_makes_the_next_poll_read_everything_again(
    fake_node: dict[str, str],
) -> None:
    shell = ShellTransport({"n1": fake_node})
    state = Path(fake_node["GPUCTL_LAB_STATE"])
    with Gatherer(shell) as gatherer:
        gatherer.gather([_node("n1")])
        data = nodestate.read_state(state)
        data["driver_version"] = "600.10.01"
        nodestate.write_state(state, data)
        upgraded = gatherer.gather([_node("n1")]).nodes[0]
        gatherer.gather([_node("n1")])
    assert upgraded.observation is not None
    assert upgraded.observation.facts.driver_version == "600.10.01"
    assert upgraded.observation.facts.cuda_version is None  # not the old driver's CUDA
    assert "--version" in shell.calls[2][1]  # the poll after the change reads it all again


def test_a_probe_session_cut_mid_way_is_a_node_that_did_not_answer_not_unreadable_gpus() -> None:
    """`lab down` (or a node dying) while a probe runs: the session ends with no exit status and
    no whole answer. The node did not answer; its GPUs must not be judged unreadable (which
    cordons it for health)."""
    from gpuctl.config.health_rules import load_rules
    from gpuctl.core.health import evaluate_fleet
    from gpuctl.core.health.model import Action

    def cut(node: NodeSpec, command: str) -> ExecResult:
        return ExecResult(exit_code=None, stdout=b"", stderr=b"", duration_s=0.1)

    names = ["n1", "n2"]
    with Gatherer(FakeTransport(dict.fromkeys(names, cut))) as gatherer:
        fleet = gatherer.gather([_node(n) for n in names])
    for node in fleet.nodes:
        assert node.reach is Reach.ERROR and node.state is NodeState.DOWN
        cut_at = "the session was cut before the probe finished (no exit status, 0 bytes of output)"
        assert node.error == f"{node.name}: {cut_at}"
    verdicts = evaluate_fleet(fleet, {}, expected_gpus={}, rules=load_rules())
    assert [v.action for v in verdicts] == [Action.NONE, Action.NONE]
    assert all(r.rule == "unreachable" for v in verdicts for r in v.reasons)
