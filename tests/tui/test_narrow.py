"""The dashboard at 100x30 and 80x24: each number card's title whole (or its short form),
and its headline whole or cut between words."""

from __future__ import annotations

import pytest

from gpuctl.ops.dashboard import Services
from gpuctl.testing.fakerunner import ManualClock
from gpuctl.testing.memstore import MemoryStore
from gpuctl.tui import format as fmt
from gpuctl.tui.widgets.numbers import NumberCard

from .conftest import make_app, populate, screen_text, settle


@pytest.mark.parametrize("size", [(100, 30), (80, 24)])
async def test_the_number_cards_show_their_titles_whole_on_a_narrow_terminal(
    services: Services, store: MemoryStore, clock: ManualClock, size: tuple[int, int]
) -> None:
    populate(store, clock)
    app = make_app(services)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        lines = screen_text(app)
        text = "\n".join(lines)
        titles = dict(fmt.NUMBER_KEYS)
        for card in app.screen.query(NumberCard):
            box = card.content_region
            shown = lines[box.y][box.x : box.x + box.width].strip()
            assert shown in (titles[card.key], fmt.SHORT_TITLES[card.key]), f"at {size}:\n{text}"
            headline = lines[box.y + 1][box.x : box.x + box.width].strip()
            assert headline, f"at {size}:\n{text}"
            assert f"{card.headline} ".startswith(f"{headline} "), f"at {size}:\n{text}"
