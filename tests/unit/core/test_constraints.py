"""One anti-affinity and one GPU-model rule, asked by placement (a request) and consolidation (a
job placed already) alike."""

from typing import Any

import pytest

from gpuctl.core.placement.constraints import clash, model_ok
from gpuctl.core.placement.model import Allocation, JobRequest


def placed(job: str, **kw: Any) -> Allocation:
    return Allocation(job=job, node="n1", cards=(0,), mib_per_card=1024, **kw)


OTHERS = (
    placed("b"),
    placed("c", avoid_jobs=("a",)),
    placed("d", group="web"),
    placed("e", avoid_groups=("train",)),
    placed("f", group="db"),
)


@pytest.mark.parametrize("other", OTHERS, ids=lambda a: a.job)
def test_a_request_and_the_same_job_placed_clash_with_the_same_jobs_for_the_same_reason(
    other: Allocation,
) -> None:
    request = JobRequest(name="a", group="train", avoid_jobs=("b",), avoid_groups=("web",))
    job = placed("a", group="train", avoid_jobs=("b",), avoid_groups=("web",))
    assert clash(request, other) == clash(job, other)


def test_why_a_job_may_not_share_a_node_names_the_other_job_or_group() -> None:
    job = placed("a", group="train", avoid_jobs=("b",), avoid_groups=("web",))
    assert [clash(job, other) for other in OTHERS] == [
        "runs job b",
        "runs job c",
        "runs a job of group web",
        "runs job e, which avoids group train",
        None,
    ]
    assert clash(OTHERS[1], job) == "runs job a"  # symmetric


def test_any_card_serves_a_job_that_asks_no_model_and_words_must_match() -> None:
    assert model_ok((), None)
    assert model_ok((), "NVIDIA A10")
    assert model_ok(("H100",), "NVIDIA H100 80GB HBM3")
    assert not model_ok(("A10",), "NVIDIA A100-SXM4-80GB")
    assert not model_ok(("H100",), None)
