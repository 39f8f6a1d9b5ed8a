"""Health hints for `gpuctl status`: what the last poll shows that an operator should notice."""

from gpuctl.core.health.poll_hints import node_hints
from gpuctl.core.model import NodeFacts, NodeSnapshot, NodeState, Observation, Reach


def polled(clock_s: float | None, taken_at: float | None = 1_000_000.0) -> NodeSnapshot:
    obs = Observation(facts=NodeFacts(hostname="n1", clock_s=clock_s))
    return NodeSnapshot("n1", Reach.OK, NodeState.READY, observation=obs, taken_at=taken_at)


def test_a_node_clock_far_from_gpuctls_is_a_hint_saying_which_way() -> None:
    assert node_hints(polled(1_000_000.0 - 95)) == ("clock 95 s behind",)
    assert node_hints(polled(1_000_000.0 + 3600)) == ("clock 3600 s ahead",)


def test_a_clock_within_the_probes_own_delay_or_unknown_is_no_hint() -> None:
    assert node_hints(polled(1_000_000.0 + 4)) == ()  # read during a slow probe
    assert node_hints(polled(1_000_000.0 - 1)) == ()  # whole seconds
    assert node_hints(polled(None)) == ()
    assert node_hints(polled(1_000_000.0, taken_at=None)) == ()
