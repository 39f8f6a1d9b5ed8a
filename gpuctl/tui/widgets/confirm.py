"""The confirm dialog: the service's plan, word for word; applied only on an explicit yes."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from gpuctl.ops.actions import ActionPlan
from gpuctl.tui import format as fmt


class ConfirmDialog(ModalScreen[bool]):
    """Dismisses with True only on `y` or the Apply button; `n`, `esc` and Cancel give False.
    A plan with nothing to apply shows only Close."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "apply", "Apply"),
        Binding("n,escape", "cancel", "Cancel"),
    ]

    def __init__(self, plan: ActionPlan) -> None:
        super().__init__()
        self.plan = plan

    def compose(self) -> ComposeResult:
        title = self.plan.action + (f" {self.plan.target}" if self.plan.target else "")
        with Vertical(id="dialog"):
            yield Static(fmt.plain(title), id="dialog-title")
            yield Static(fmt.plain(self.plan.text), id="plan")
            with Horizontal(id="buttons"):
                if self.plan.applicable:
                    yield Button("Apply (y)", variant="warning", id="apply")
                    yield Button("Cancel (n)", id="cancel")
                else:
                    yield Button("Close (esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action == "apply" and not self.plan.applicable)  # False: hidden and off

    def action_apply(self) -> None:
        self.dismiss(self.plan.applicable)

    def action_cancel(self) -> None:
        self.dismiss(False)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "apply":
            self.action_apply()
        else:
            self.action_cancel()
