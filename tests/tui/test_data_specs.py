"""A dashboard refresh reads each job's typed spec as stored: no spec is validated again."""

from __future__ import annotations

import pytest

from gpuctl.config.jobspec import JobSpecModel
from gpuctl.ops.dashboard import Services, collect
from gpuctl.testing.fakerunner import ManualClock
from gpuctl.testing.memstore import MemoryStore

from .conftest import populate


def test_a_refresh_reads_typed_specs_and_validates_no_spec_file(
    services: Services, store: MemoryStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = populate(store, clock)

    def validated(*args: object, **kwargs: object) -> None:
        raise AssertionError("a job spec was validated again")

    monkeypatch.setattr(JobSpecModel, "model_validate", classmethod(validated))
    monkeypatch.setattr(JobSpecModel, "__init__", validated)
    data = collect(services)  # the numbers, the fleet view, why each queued job waits
    assert data.store_error is None
    why = data.job(made["big"].id).why  # type: ignore[union-attr]
    assert why is not None and "8" in why
