"""The composition root: the one place gpuctl's parts are made and put together, for every front
end: the CLI's commands, the dashboard, playbooks and the metrics server.

A `Root` holds what a run was given (the environment, the state folder) and how each part is made
(`gpuctl.ops.stores`, `gpuctl.ops.parts`): the clock, the store opener, the transport and the
fleet link over it. The CLI builds one from its `AppContext`, where tests inject a manual clock, a
store opener or a scripted fleet instead of patching internals. Its methods put the parts
together: the store for one use (`store`), the control loop (`loop`), the plan-then-apply actions
(`actions`), the dashboard's services (`dashboard`, `saved_dashboard`), a playbook's services
(`playbook`) and the metrics refresher (`refresher`). Nothing is left open when building any
part fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from gpuctl.adapters.clock import SystemClock
from gpuctl.adapters.protocols import Clock, Store, Transport
from gpuctl.core.model import Inventory
from gpuctl.ops.loop import control_loop
from gpuctl.ops.parts import (
    FleetLink,
    FleetReader,
    LinkFactory,
    minute_of_day,
    sleep_of,
    ssh_link,
)
from gpuctl.ops.stores import SessionStore, StoreOpener, open_sqlite, per_use, session

if TYPE_CHECKING:
    from gpuctl.core.health import HealthRules
    from gpuctl.ops.actions import FleetActions
    from gpuctl.ops.dashboard import Services as DashServices
    from gpuctl.ops.gather import Gatherer
    from gpuctl.ops.loop import Action, Reconciler, ReconcileSettings
    from gpuctl.ops.metrics import Refresher
    from gpuctl.ops.playbook.model import Services as PlaybookServices
    from gpuctl.ops.shared_fleet import SharedFleet


def default_transport() -> Transport:
    """SSH with gpuctl's own known_hosts and the operator's (`gpuctl.ops.gather`)."""
    from gpuctl.ops.gather import default_transport as ssh

    return ssh()


@dataclasses.dataclass
class Loop:
    """The control loop as `gpuctl reconcile` runs it, and its parts: the store, and the fleet
    link (the gatherer and the job runner over one transport). `close()` closes the link (and
    the transport) and the store."""

    loop: Reconciler
    link: FleetLink
    inventory: Inventory
    state_dir: Path

    def close(self) -> None:
        try:
            self.link.close()
        finally:
            self.loop.store.close()


@dataclasses.dataclass(frozen=True)
class Root:
    """What a run was given and how its parts are made; see the module docstring."""

    env: Mapping[str, str]
    state_dir: Path
    clock: Clock = dataclasses.field(default_factory=SystemClock)
    open_store: StoreOpener = open_sqlite
    transport: Callable[[], Transport] = default_transport
    link: LinkFactory = ssh_link
    pollers: int | None = None  # poller processes of a fleet link (None: `auto_pollers`)

    @property
    def operator(self) -> str:
        """Who is acting, for the audit log ($USER)."""
        from gpuctl.ops.jobs import operator

        return operator(self.env)

    def sleep(self, seconds: float) -> None:
        """A wait, on the root's clock (`parts.sleep_of`)."""
        sleep_of(self.clock)(seconds)

    def minute_of_day(self) -> int:
        return minute_of_day(self.clock)

    @contextlib.contextmanager
    def store(self, *, write: bool) -> Iterator[Store]:
        """The state store, for one use. Opened for writing it fails closed (`StateError`);
        read-only on a folder without a store it is an empty view and creates nothing."""
        store = self.open_store(self.state_dir, write=write)
        try:
            yield store
        finally:
            store.close()

    def connect(self, inventory: Inventory | None = None) -> FleetLink:
        """The fleet link over a new transport (closed with the link); for polling `inventory`
        (the control loop, the metrics server), its gatherer spread over `pollers` processes
        when that is more than one (`gpuctl.ops.gather_pool`)."""
        transport = self.transport()
        try:
            link = self.link(transport, self.clock)
        except BaseException:
            transport.close()
            raise
        return link if inventory is None else self._pooled(link, inventory)

    def _pooled(self, link: FleetLink, inventory: Inventory) -> FleetLink:
        """`link` polling through poller processes, each with an SSH transport made as
        `transport` makes one (it must pickle: a module's function); an injected link or
        transport factory (a test's) keeps polling in process."""
        import pickle

        from gpuctl.ops.gather_pool import PoolGatherer, auto_pollers

        pollers = self.pollers if self.pollers is not None else auto_pollers(len(inventory.nodes))
        if pollers <= 1 or self.link is not ssh_link:
            return link
        try:
            pickle.dumps(self.transport)
        except (pickle.PicklingError, AttributeError, TypeError):
            return link
        pool = PoolGatherer(
            self.transport, pollers=pollers, transport=link.transport, clock=self.clock
        )

        def close() -> None:
            try:
                pool.close()
            finally:
                link.close()

        return dataclasses.replace(link, gatherer=pool, closer=close)

    def shared_fleet(self, poller: FleetReader | None, *, live: bool = False) -> SharedFleet:
        """The fleet as the control loop published it into the store while it is fresh, else
        (or `live`) a poll through `poller` (`gpuctl.ops.shared_fleet`): what status, dash and
        metrics read."""
        from gpuctl.ops.shared_fleet import SharedFleet

        return SharedFleet(lambda: self.store(write=False), poller, self.clock, live=live)

    def gatherer(self) -> Gatherer:
        """A gatherer over a new transport (closing it closes the transport), for commands that
        only read the fleet (with a progress bar)."""
        from gpuctl.ops.gather import Gatherer

        return Gatherer(self.transport(), clock=self.clock)

    # --- the control loop ------------------------------------------------------------------------

    def loop(
        self,
        inventory: Inventory,
        *,
        write: bool,
        settings: ReconcileSettings | None = None,
        on_action: Callable[[Action], None] | None = None,
        history_file: bool = False,
    ) -> Loop:
        """`write=False`: the store read-only (a dry run creates nothing). `history_file`: the
        health rules look back at the state dir's `health-history.json` (shared with `gpuctl
        health`), not at samples kept in memory."""
        from gpuctl.ops.health import SampleHistory
        from gpuctl.ops.loop import ReconcileSettings

        store = self.open_store(self.state_dir, write=write)
        try:
            link = self.connect(inventory)
        except BaseException:
            store.close()
            raise
        try:
            loop = control_loop(
                store,
                link.gatherer,
                link.runner,
                inventory,
                self.clock,
                settings=settings or ReconcileSettings(dry_run=not write),
                env=self.env,
                state_dir=self.state_dir,
                on_action=on_action,
                history=SampleHistory.in_state_dir(self.state_dir) if history_file else None,
            )
        except BaseException:
            link.close()
            store.close()
            raise
        return Loop(loop, link, inventory, self.state_dir)

    # --- services ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def actions(self, inventory: Inventory, *, moves: bool = True) -> Iterator[FleetActions]:
        """Cordon, uncordon, drain and consolidate, planned then carried out, the store opened
        per use; `moves` (drain, consolidate): over a fleet link closed after (cordon and
        uncordon never reach the nodes)."""
        opener = per_use(self.open_store, self.state_dir)
        if not moves:
            yield self._actions(inventory, None, opener)
            return
        link = self.connect()
        try:
            yield self._actions(inventory, link, opener)
        finally:
            link.close()

    def _actions(
        self, inventory: Inventory, link: FleetLink | None, opener: SessionStore
    ) -> FleetActions:
        from gpuctl.ops.actions import FleetActions

        return FleetActions(
            open_store=opener,
            clock=self.clock,
            operator=self.operator,
            inventory=inventory,
            fleet=link,
            runner=None if link is None else link.runner,
            env=self.env,
            state_dir=self.state_dir,
        )

    def dashboard(
        self, inventory: Inventory, *, label: str, readonly: bool, live: bool = False
    ) -> DashServices:
        """The dashboard over a live fleet: one fleet link shared by the polls (the published
        snapshot read instead while fresh, unless `live`), the log reader and the actions (drain
        and consolidation move jobs through its job runner); the store read through one
        connection kept open."""
        from gpuctl.config.health_rules import load_rules
        from gpuctl.ops.dashboard import LiveSource, RemoteLogs, RemoteProcesses, Services

        opener = session(self.open_store, self.state_dir, kept=True)
        link = self.connect()
        try:
            rules = load_rules()
        except BaseException:
            link.close()
            raise
        return Services(
            source=LiveSource(inventory, self.shared_fleet(link, live=live), label),
            open_store=opener,
            clock=self.clock,
            actions=None if readonly else self._actions(inventory, link, opener),
            rules=rules,
            expected_gpus={n.name: n.expected_gpus for n in inventory.nodes},
            logs=RemoteLogs(link.runner, inventory),
            processes=RemoteProcesses(link.runner, inventory),
            operator=self.operator,
        )

    def saved_dashboard(self, path: Path) -> DashServices:
        """Offline review of a saved snapshot: read-only, no logs (no nodes to ask)."""
        from gpuctl.config.health_rules import load_rules
        from gpuctl.ops.dashboard import SavedSource, Services

        return Services(
            source=SavedSource(path),
            open_store=session(self.open_store, self.state_dir, kept=True),
            clock=self.clock,
            rules=load_rules(),
        )

    def playbook(
        self, inventory: Inventory, *, write: bool
    ) -> tuple[PlaybookServices, Callable[[], None]]:
        """What a playbook's steps call: the control loop (the store read-only for a dry run:
        nothing is created), its gatherer and transport, the state folder's health history, the
        built-in health rules; and what closes them."""
        from gpuctl.config.health_rules import load_rules
        from gpuctl.ops.health import SampleHistory
        from gpuctl.ops.playbook.model import Services

        parts = self.loop(inventory, write=write)
        try:
            services = Services(
                loop=parts.loop,
                gatherer=parts.link.gatherer,
                transport=parts.link.transport,
                history=SampleHistory.in_state_dir(self.state_dir),
                rules=load_rules(None),
                operator=self.operator,
                env=self.env,
                sleep=self.sleep,
                minute_of_day=self.minute_of_day,
            )
        except BaseException:
            parts.close()
            raise
        return services, parts.close

    @contextlib.contextmanager
    def refresher(
        self, rules: HealthRules, inventory: Inventory | None, *, live: bool = False
    ) -> Iterator[Refresher]:
        """The metrics refresher: polls `inventory` over one gatherer kept for its life (the
        published snapshot read instead while fresh, unless `live`; None: the store only), the
        store opened read-only at each refresh."""
        from gpuctl.ops.metrics import Refresher

        def opener() -> Store:
            return self.open_store(self.state_dir, write=False)

        if inventory is None:
            yield Refresher(open_store=opener, clock=self.clock, rules=rules)
            return
        link = self.connect(inventory)
        try:
            yield Refresher(
                open_store=opener,
                clock=self.clock,
                rules=rules,
                inventory=inventory,
                gatherer=self.shared_fleet(link.gatherer, live=live),
            )
        finally:
            link.close()
