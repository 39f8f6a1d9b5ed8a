"""The default policy keeps card models that pinned work needs for that work: a job that may run
anywhere stays off a model whose cards the pinned jobs of the workload would fill."""

from gpuctl.core.placement import Card, FleetState, JobRequest, JobShape, PlacementNode, Settings
from gpuctl.core.placement.engine import plan
from gpuctl.core.placement.fit import Demand, NodeFree
from gpuctl.core.placement.plan import Placed
from gpuctl.core.placement.policies import Gpuctl
from gpuctl.core.units import MemPerCard

GIB = 1024
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
OPEN = Settings(policy="default", band_max=1.0, headroom=0.0)


def node(name: str, model: str, cpu_cores: int) -> PlacementNode:
    cards = tuple(Card(i, 80 * GIB, uuid=f"GPU-{name}-{i}", model=model) for i in range(2))
    return PlacementNode(name=name, cards=cards, cpu_milli=cpu_cores * 1000)


def job(name: str, cpu_cores: int, models: tuple[str, ...] = (), priority: int = 0) -> JobRequest:
    shape = JobShape(
        gpus=1, mem_per_card=MemPerCard.whole_card(), gpu_models=models, cpu_milli=cpu_cores * 1000
    )
    return JobRequest(name=name, shape=shape, priority=priority)


def test_a_job_that_may_run_anywhere_leaves_the_pinned_jobs_model_to_them() -> None:
    # a-h100 has CPU to spare, so without the reserve the free job goes there (its cards stay
    # fed), and then only one of the two H100-only jobs finds a card.
    state = FleetState(nodes=(node("a-h100", H100, 64), node("b-a100", A100, 10)), allocations=())
    jobs = [
        job("free", 8, priority=1),
        job("pinned-1", 1, (H100,)),
        job("pinned-2", 1, ("H100",)),
    ]
    p = plan(state, jobs, OPEN)
    where = {o.job: o.allocation.node for o in p.jobs if isinstance(o, Placed)}
    assert where == {"free": "b-a100", "pinned-1": "a-h100", "pinned-2": "a-h100"}


def test_the_reserve_charges_only_jobs_with_a_choice_of_model_on_a_pressed_model() -> None:
    pinned = Demand(gpus=1, mib_per_card=1000, whole=True, gpu_models=("T4",))
    free = Demand(gpus=1, mib_per_card=1000, whole=True)
    workload = ((pinned, 0.5), (free, 0.5))
    bound = Gpuctl().for_fleet({"T4": 2, "G2": 8})
    assert bound.pressure(workload) == {"T4": 1.0}  # half the GPU pinned to a fifth of the cards
    t4 = NodeFree("t", (1000, 1000), (1000, 1000), gpu_model="T4")
    g2 = NodeFree("g", (1000,) * 8, (1000,) * 8, gpu_model="G2")
    unbound = Gpuctl()
    for n in (t4, g2):
        assert bound.choose(n, free, workload) is not None
    assert bound.choose(t4, free, workload).score < unbound.choose(t4, free, workload).score  # type: ignore[union-attr]
    assert bound.choose(g2, free, workload) == unbound.choose(g2, free, workload)
    assert bound.choose(t4, pinned, workload) == unbound.choose(t4, pinned, workload)
