"""A node's state, from its answer and the store's cordons, drains and moves: one function behind
`gpuctl status`, `nodes list|show`, the dashboard, the report, metrics and playbook selectors."""

from hypothesis import given
from hypothesis import strategies as st

from gpuctl.core.fleet.nodestate import NODE_STATES, NodeStatus, draining_nodes, node_status
from gpuctl.core.jobs.model import Cordon, Event
from gpuctl.core.model import NodeSnapshot, NodeState, Observation, Reach

T = 1_700_000_000.0
ECC = Cordon("n1", "GPU 1: 3 uncorrected ECC errors", "gpuctl", "health", T)
BOB = Cordon("n1", "fan noise", "bob", "operator", T)


def answered(nvml_ok: bool = True) -> NodeSnapshot:
    state = NodeState.READY if nvml_ok else NodeState.UNKNOWN
    return NodeSnapshot("n1", Reach.OK, state, observation=Observation(nvml_ok=nvml_ok))


def silent(reach: Reach = Reach.TIMEOUT) -> NodeSnapshot:
    return NodeSnapshot("n1", reach, NodeState.DOWN, error="n1: timeout (connect) after 5s")


def event(kind: str, at: float, node: str = "n1") -> Event:
    return Event(at, "bob", kind, f"{kind} {node}", node=node)


def test_a_cordoned_node_is_cordoned_with_reason_who_and_when() -> None:
    status = node_status(answered(), ECC)
    assert status == NodeStatus(NodeState.CORDONED, ECC.reason, "gpuctl", "health", T, cordon=ECC)
    assert status.to_dict() == {
        "state": "cordoned",
        "state_reason": "GPU 1: 3 uncorrected ECC errors",
        "state_by": "gpuctl",
        "state_source": "health",
        "state_since": T,
    }
    assert status.cordoned


def test_a_node_being_drained_is_draining_and_ready_without_a_cordon() -> None:
    assert node_status(answered(), BOB, draining=True).state is NodeState.DRAINING
    assert node_status(answered(), BOB, draining=True).cordoned
    ready = node_status(answered())
    assert (ready.state, ready.reason, ready.by, ready.since) == (NodeState.READY, None, None, None)
    assert not ready.cordoned


def test_a_node_that_does_not_answer_is_down_whatever_the_store_says() -> None:
    status = node_status(silent(), BOB, draining=True)
    assert (status.state, status.reason) == (NodeState.DOWN, "n1: timeout (connect) after 5s")
    assert status.cordon == BOB and not status.cordoned
    assert node_status(None).state is NodeState.DOWN  # not polled at all


def test_unreadable_gpus_are_unknown_unless_a_cordon_says_more() -> None:
    assert node_status(answered(nvml_ok=False)).state is NodeState.UNKNOWN
    assert node_status(answered(nvml_ok=False), ECC).state is NodeState.CORDONED


def test_a_drain_is_its_newest_cordon_event_while_the_node_still_holds_jobs() -> None:
    newest_first = [event("drain", T + 10), event("cordon", T)]
    assert draining_nodes({"n1"}, newest_first, {"n1": ["j1"]}) == {"n1"}
    assert draining_nodes({"n1"}, newest_first, {}) == frozenset()  # every job moved: cordoned
    recordoned = [event("cordon", T + 20), *newest_first]
    assert draining_nodes({"n1"}, recordoned, {"n1": ["j1"]}) == frozenset()
    assert draining_nodes(set(), newest_first, {"n1": ["j1"]}) == frozenset()  # uncordoned


def test_a_cordoned_node_whose_job_is_moving_is_draining() -> None:
    assert draining_nodes({"n1"}, [event("cordon", T)], {"n1": ["j1"]}, {"j1"}) == {"n1"}
    assert draining_nodes({"n1"}, [event("cordon", T)], {"n1": ["j1"]}, {"j2"}) == frozenset()


@given(
    reach=st.sampled_from(list(Reach)),
    nvml_ok=st.booleans(),
    cordon=st.sampled_from([None, ECC, BOB]),
    draining=st.booleans(),
)
def test_every_node_has_exactly_one_of_the_designs_states(
    reach: Reach, nvml_ok: bool, cordon: Cordon | None, draining: bool
) -> None:
    node = answered(nvml_ok) if reach is Reach.OK else silent(reach)
    status = node_status(node, cordon, draining)
    assert status.state.value in NODE_STATES
    assert (status.state is NodeState.DOWN) is (reach is not Reach.OK)
    if reach is Reach.OK:
        assert status.cordoned is (cordon is not None)
        assert (status.state is NodeState.DRAINING) is (cordon is not None and draining)
        assert (status.state is NodeState.READY) is (cordon is None and nvml_ok)
    if status.cordoned:
        assert cordon is not None
        assert (status.reason, status.by, status.since) == (cordon.reason, cordon.operator, T)
