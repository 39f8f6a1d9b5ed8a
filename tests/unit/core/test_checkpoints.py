"""Which checkpoint a restarted job resumes from, and what a marker says."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuctl.core.jobs.checkpoints import (
    Refused,
    choose_resume,
    judge_checkpoint,
    parse_marker,
    step_dir_name,
    step_of_dir,
    unusable_committed,
)
from gpuctl.core.jobs.model import Checkpoint, CheckpointMarker, Incarnation, IncarnationState

DIR = "/ckpt/train-demo"
SHA_A = "a" * 64
SHA_B = "b" * 64


def inc(
    n: int,
    started_at: float,
    ended_at: float | None = None,
    state: IncarnationState = IncarnationState.EXITED,
    clock_offset_s: float | None = None,
) -> Incarnation:
    return Incarnation(
        job_id="train-demo-1a2b3c",
        n=n,
        node=f"node-{n}",
        cards=(0,),
        gpu_uuids=("GPU-0",),
        mib_per_card=8192,
        whole=False,
        state=state,
        started_at=started_at,
        run_dir=f"/runs/{n}",
        ended_at=ended_at,
        clock_offset_s=clock_offset_s,
    )


def ok(step: int, incarnation: int, at: float) -> CheckpointMarker:
    return CheckpointMarker(f"{DIR}/{step_dir_name(step)}", incarnation, step, at, True)


def bad(step: int, incarnation: int | None, problem: str) -> CheckpointMarker:
    return CheckpointMarker(f"{DIR}/{step_dir_name(step)}", incarnation, step, None, False, problem)


# --- choose_resume -----------------------------------------------------------------------------


def test_no_checkpoints_means_a_fresh_start_without_warnings() -> None:
    assert choose_resume([], history=[inc(1, 100.0, 200.0)], next_incarnation=2) == (None, [])


def test_the_newest_step_of_an_older_incarnation_wins() -> None:
    history = [inc(1, 100.0, 200.0, IncarnationState.LOST), inc(2, 210.0)]
    markers = [ok(10, 1, 150.0), ok(30, 2, 260.0), ok(20, 2, 240.0)]
    chosen, warnings = choose_resume(markers, history=history, next_incarnation=3)
    assert chosen == ok(30, 2, 260.0)
    assert warnings == []


def test_on_equal_steps_the_later_incarnation_wins() -> None:
    history = [inc(1, 100.0, 200.0), inc(2, 210.0, 400.0)]
    chosen, _ = choose_resume(
        [ok(20, 2, 220.0), ok(20, 1, 190.0)], history=history, next_incarnation=3
    )
    assert chosen is not None and chosen.incarnation == 2


def test_a_checkpoint_of_the_incarnation_being_started_or_newer_is_never_used() -> None:
    history = [inc(1, 100.0, 200.0), inc(2, 210.0, 300.0)]
    markers = [ok(10, 1, 150.0), ok(40, 2, 250.0)]
    chosen, warnings = choose_resume(markers, history=history, next_incarnation=2)
    assert chosen == ok(10, 1, 150.0)
    assert warnings == [
        "skipping step-00000040 of incarnation 2: not older than the incarnation being started (2)"
    ]


def test_commits_of_a_fenced_copy_after_it_was_declared_lost_are_stale() -> None:
    # incarnation 1 lost at 200 (its node partitioned) kept running and committing;
    # incarnation 2 resumed from step 10 elsewhere and committed step 15.
    history = [inc(1, 100.0, 200.0, IncarnationState.LOST), inc(2, 210.0)]
    markers = [ok(10, 1, 150.0), ok(20, 1, 250.0), ok(30, 1, 290.0), ok(15, 2, 280.0)]
    chosen, warnings = choose_resume(markers, history=history, next_incarnation=3)
    assert chosen == ok(15, 2, 280.0)
    assert warnings == [
        "skipping step-00000030 of incarnation 1: stale: committed after that incarnation was "
        "declared lost (a fenced copy)",
        "skipping step-00000020 of incarnation 1: stale: committed after that incarnation was "
        "declared lost (a fenced copy)",
    ]


def test_commit_times_from_a_node_whose_clock_is_off_are_read_on_gpuctls_clock() -> None:
    # Incarnation 1 ran 100-200 (gpuctl's clock) on a node 600 s behind: its commits are stamped
    # 400-ish on gpuctl's reading. Incarnation 2 (lost at 400) ran on a node 600 s ahead, and a
    # fenced copy of it kept committing after that.
    history = [
        inc(1, 100.0, 200.0, clock_offset_s=-600.0),
        inc(2, 210.0, 400.0, IncarnationState.LOST, clock_offset_s=600.0),
    ]
    markers = [ok(10, 1, 150.0 - 600), ok(20, 2, 390.0 + 600), ok(30, 2, 420.0 + 600)]
    chosen, warnings = choose_resume(markers, history=history, next_incarnation=3)
    assert chosen == ok(20, 2, 990.0)
    assert warnings == [
        "skipping step-00000030 of incarnation 2: stale: committed after that incarnation was "
        "declared lost (a fenced copy)"
    ]
    # uncorrected, the good step 20 would read as a fenced copy and step 10 as another job's
    unknown = [inc(1, 100.0, 200.0), inc(2, 210.0, 400.0, IncarnationState.LOST)]
    assert choose_resume(markers, history=unknown, next_incarnation=3)[0] is None


def test_a_clock_offset_within_its_measurement_error_changes_nothing() -> None:
    history = [inc(1, 100.0, 200.0, IncarnationState.KILLED, clock_offset_s=4.0)]
    chosen, warnings = choose_resume(
        [ok(10, 1, 150.0), ok(20, 1, 201.0)], history=history, next_incarnation=2
    )
    assert chosen == ok(10, 1, 150.0) and len(warnings) == 1


def test_a_commit_after_an_incarnation_ended_is_stale() -> None:
    history = [inc(1, 100.0, 200.0, IncarnationState.KILLED)]
    chosen, warnings = choose_resume(
        [ok(10, 1, 150.0), ok(20, 1, 201.0)], history=history, next_incarnation=2
    )
    assert chosen == ok(10, 1, 150.0)
    assert warnings == [
        "skipping step-00000020 of incarnation 1: stale: committed after that incarnation ended"
    ]


def test_an_invalid_newest_checkpoint_gives_the_one_before_with_a_warning() -> None:
    history = [inc(1, 100.0, 300.0)]
    markers = [ok(10, 1, 150.0), ok(20, 1, 200.0), bad(30, 1, "checksum mismatch: model.pt")]
    chosen, warnings = choose_resume(markers, history=history, next_incarnation=2)
    assert chosen == ok(20, 1, 200.0)
    assert warnings == ["skipping step-00000030 of incarnation 1: checksum mismatch: model.pt"]


def test_a_half_written_checkpoint_without_a_marker_is_skipped() -> None:
    history = [inc(1, 100.0, 300.0)]
    markers = [ok(20, 1, 200.0), bad(30, None, "no marker")]
    chosen, warnings = choose_resume(markers, history=history, next_incarnation=2)
    assert chosen == ok(20, 1, 200.0)
    assert warnings == ["skipping step-00000030: no marker"]


def test_invalid_checkpoints_older_than_the_choice_are_not_reported() -> None:
    history = [inc(1, 100.0, 300.0)]
    markers = [bad(10, 1, "checksum mismatch: a"), ok(20, 1, 200.0)]
    assert choose_resume(markers, history=history, next_incarnation=2) == (ok(20, 1, 200.0), [])


def test_when_every_checkpoint_is_bad_none_is_chosen_and_each_is_named() -> None:
    history = [inc(1, 100.0, 300.0)]
    markers = [bad(10, 1, "missing file: model.pt"), bad(20, 1, "checksum mismatch: model.pt")]
    chosen, warnings = choose_resume(markers, history=history, next_incarnation=2)
    assert chosen is None
    assert warnings == [
        "skipping step-00000020 of incarnation 1: checksum mismatch: model.pt",
        "skipping step-00000010 of incarnation 1: missing file: model.pt",
    ]


# --- unusable_committed ------------------------------------------------------------------------


def damaged(step: int, incarnation: int | None, at: float, problem: str) -> CheckpointMarker:
    """A marker that parses (it names its incarnation and time) but fails verification."""
    return CheckpointMarker(f"{DIR}/{step_dir_name(step)}", incarnation, step, at, False, problem)


def recorded(step: int, incarnation: int, at: float) -> Checkpoint:
    path = f"{DIR}/{step_dir_name(step)}"
    return Checkpoint("train-demo-1a2b3c", incarnation, step, path, at, "shared")


def named(refused: list[Refused]) -> list[str]:
    return [str(r) for r in refused]


def test_committed_checkpoints_all_unusable_are_named_newest_first() -> None:
    history = [inc(1, 100.0, 300.0, IncarnationState.LOST)]
    markers = [
        damaged(65, 1, 150.0, "missing file: model.pt"),
        damaged(70, 1, 200.0, "checksum mismatch: model.pt"),
    ]
    store = [recorded(70, 1, 200.0), recorded(65, 1, 150.0), recorded(60, 1, 120.0)]
    assert choose_resume(markers, history=history, next_incarnation=2)[0] is None
    found = unusable_committed(markers, recorded=store, history=history, next_incarnation=2)
    assert named(found) == [
        "step 70 of incarnation 1: checksum mismatch: model.pt",
        "step 65 of incarnation 1: missing file: model.pt",
        "step 60 of incarnation 1: not found",  # pruned, or its storage is gone
    ]


def test_a_job_that_never_committed_a_checkpoint_has_none_unusable() -> None:
    history = [inc(1, 100.0, 300.0)]
    assert unusable_committed([], recorded=[], history=history, next_incarnation=2) == []
    half_written = [bad(30, None, "no marker")]
    assert unusable_committed(half_written, recorded=[], history=history, next_incarnation=2) == []


def test_a_damaged_checkpoint_the_store_never_recorded_counts_when_it_is_this_job_s() -> None:
    history = [inc(1, 1000.0, 1300.0, IncarnationState.LOST)]
    markers = [
        damaged(20, 1, 1100.0, "checksum mismatch: model.pt"),  # committed since the last scan
        damaged(500, 1, 400.0, "checksum mismatch: model.pt"),  # before incarnation 1 started
        damaged(600, 3, 1100.0, "checksum mismatch: model.pt"),  # an incarnation it never had
        damaged(40, 1, 1200.0, "marker of another job (other-1a2b3c)"),
        damaged(50, 1, 1400.0, "checksum mismatch: model.pt"),  # a fenced copy's, after the loss
        bad(60, None, "unreadable marker: not JSON (JSONDecodeError)"),
    ]
    found = unusable_committed(markers, recorded=[], history=history, next_incarnation=2)
    assert found == [Refused(1, 20, "checksum mismatch: model.pt")]


def test_a_recorded_checkpoint_refused_as_stale_is_named_with_why() -> None:
    history = [inc(1, 100.0, 200.0, IncarnationState.KILLED)]
    markers = [ok(20, 1, 201.0)]
    found = unusable_committed(
        markers, recorded=[recorded(20, 1, 201.0)], history=history, next_incarnation=2
    )
    assert named(found) == [
        "step 20 of incarnation 1: stale: committed after that incarnation ended"
    ]


def test_checkpoints_this_job_never_wrote_are_skipped() -> None:
    # a reused checkpoint dir: an earlier job's checkpoints predate this job's incarnation 1,
    # and an incarnation number this job never had is not its own either.
    history = [inc(1, 1000.0, 1300.0)]
    markers = [ok(500, 1, 400.0), ok(600, 3, 450.0), ok(20, 1, 1100.0)]
    chosen, warnings = choose_resume(markers, history=history, next_incarnation=4)
    assert chosen == ok(20, 1, 1100.0)
    assert warnings == [
        "skipping step-00000600 of incarnation 3: no such incarnation in this job's history "
        "(another job's checkpoint?)",
        "skipping step-00000500 of incarnation 1: committed before that incarnation started "
        "(another job's checkpoint?)",
    ]


def test_a_running_incarnation_without_an_end_keeps_all_its_commits() -> None:
    history = [inc(1, 100.0, None, IncarnationState.RUNNING)]
    chosen, _ = choose_resume([ok(90, 1, 10_000.0)], history=history, next_incarnation=2)
    assert chosen == ok(90, 1, 10_000.0)


steps = st.integers(min_value=0, max_value=40)
incs = st.integers(min_value=1, max_value=5)
times = st.floats(min_value=0.0, max_value=1000.0)
marker_st = st.builds(
    lambda step, n, at, valid: CheckpointMarker(
        f"{DIR}/{step_dir_name(step)}", n, step, at, valid, None if valid else "no marker"
    ),
    steps,
    incs,
    times,
    st.booleans(),
)
history_st = st.lists(st.tuples(times, st.one_of(st.none(), times)), min_size=0, max_size=5).map(
    lambda spans: [inc(i + 1, s, e) for i, (s, e) in enumerate(spans)]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(marker_st, max_size=8), history_st, st.integers(min_value=1, max_value=6))
def test_the_choice_is_the_newest_eligible_checkpoint(
    markers: list[CheckpointMarker], history: list[Incarnation], next_n: int
) -> None:
    by_n = {i.n: i for i in history}

    def eligible(m: CheckpointMarker) -> bool:
        i = by_n.get(m.incarnation or 0)
        return (
            m.valid
            and m.incarnation is not None
            and m.incarnation < next_n
            and i is not None
            and m.committed_at is not None
            and i.started_at <= m.committed_at
            and (i.ended_at is None or m.committed_at <= i.ended_at)
        )

    chosen, warnings = choose_resume(markers, history=history, next_incarnation=next_n)
    good = [m for m in markers if eligible(m)]
    if not good:
        assert chosen is None
        assert len(warnings) == len(markers)
        return
    rank = (chosen.step, chosen.incarnation) if chosen else None
    assert chosen is not None and rank is not None and eligible(chosen)
    assert all((m.step, m.incarnation) <= rank for m in good)
    newer = [m for m in markers if (m.step, m.incarnation) > rank]
    assert len(warnings) == len(newer)


# --- markers -----------------------------------------------------------------------------------


def marker_text(**overrides: object) -> str:
    body: dict[str, object] = {
        "format": 1,
        "job_id": "train-demo-1a2b3c",
        "incarnation": 2,
        "step": 120,
        "committed_at": 1700000000.5,
        "files": {"model.pt": SHA_A, "opt/state.bin": SHA_B},
    }
    body.update(overrides)
    return json.dumps(body)


def test_a_well_formed_marker_gives_its_fields() -> None:
    fields = parse_marker(marker_text())
    assert fields.ok
    assert (fields.job_id, fields.incarnation, fields.step) == ("train-demo-1a2b3c", 2, 120)
    assert fields.committed_at == 1700000000.5
    assert fields.files == (("model.pt", SHA_A), ("opt/state.bin", SHA_B))


def test_a_marker_without_an_incarnation_is_well_formed_but_says_so() -> None:
    fields = parse_marker(marker_text(incarnation=None, job_id=None))
    assert fields.ok and fields.incarnation is None and fields.job_id is None
    assert parse_marker(marker_text(job_id="")).job_id is None  # a shell writer without the id


def test_malformed_markers_name_their_problem() -> None:
    cases = {
        "{": "unreadable marker: not JSON (JSONDecodeError)",
        "[1]": "unreadable marker: not a JSON object",
        marker_text(step=True): "unreadable marker: step is missing or not a whole number",
        marker_text(step=-1): "unreadable marker: step is missing or not a whole number",
        marker_text(incarnation="2"): "unreadable marker: incarnation is not a whole number",
        marker_text(committed_at="now"): "unreadable marker: committed_at is missing or not a time",
        marker_text(files={}): "unreadable marker: files (name -> sha256) is missing or empty",
        marker_text(files={"../etc/passwd": SHA_A}): (
            "unreadable marker: bad file name '../etc/passwd'"
        ),
        marker_text(files={"a\nb": SHA_A}): "unreadable marker: bad file name 'a\\nb'",
        marker_text(files={"COMMITTED": SHA_A}): "unreadable marker: bad file name 'COMMITTED'",
        marker_text(files={"m.pt": "xyz"}): "unreadable marker: bad sha256 for 'm.pt'",
        marker_text(format=2): "unreadable marker: format 2 is newer than this gpuctl understands",
    }
    for text, problem in cases.items():
        assert parse_marker(text).problem == problem, text


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200)))
def test_parse_marker_never_raises_on_arbitrary_input(text: str | bytes) -> None:
    fields = parse_marker(text)
    assert fields.ok == (fields.problem is None)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["step", "incarnation", "files", "job_id"]), json_values))
def test_parse_marker_never_raises_on_odd_field_values(fields: dict[str, object]) -> None:
    text = marker_text(**fields)
    assert isinstance(parse_marker(text).ok, bool)


def test_step_folder_names_round_trip() -> None:
    assert step_dir_name(123) == "step-00000123"
    assert step_of_dir(f"{DIR}/step-00000123") == 123
    assert step_of_dir("step-123") is None
    assert step_of_dir(".tmp-step-123-1-99") is None


def test_judging_a_folder_checks_every_file_and_its_step() -> None:
    path = f"{DIR}/step-00000120"
    both = {"model.pt": SHA_A, "opt/state.bin": SHA_B}
    assert judge_checkpoint(path, marker_text(), both) == CheckpointMarker(
        path, 2, 120, 1700000000.5, True, None
    )
    judged = judge_checkpoint(path, marker_text(), {**both, "model.pt": SHA_B})
    assert (judged.valid, judged.problem) == (False, "checksum mismatch: model.pt")
    judged = judge_checkpoint(path, marker_text(), {"model.pt": SHA_A, "opt/state.bin": None})
    assert judged.problem == "missing file: opt/state.bin"
    judged = judge_checkpoint(f"{DIR}/step-00000130", marker_text(), both)
    assert judged.problem == "marker names step 120, the folder step 130"
    judged = judge_checkpoint(path, marker_text(), both, job_id="other-000000")
    assert judged.problem == "marker of another job (train-demo-1a2b3c)"
    assert judge_checkpoint(path, None, {}) == CheckpointMarker(
        path, None, 120, None, False, "no marker"
    )
    assert (
        judge_checkpoint(path, "nope", {}).problem
        == "unreadable marker: not JSON (JSONDecodeError)"
    )
