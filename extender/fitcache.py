"""Where each request shape fits now, and why not elsewhere: the filter's per-node answers, cached.

A filter at 5 000 nodes must not run 5 000 fit checks: a view per request shape holds every
node's ``FitNote`` and the set of nodes where the shape fits. A ledger change only marks the
touched node dirty in every view (O(views)); a view refreshes its dirty nodes when it is next
used. Then a filter is set algebra (candidates ∩ fits) plus a look-up per node that does not fit.

Only node-local policies (a node's key reads that node alone) may cache keys; for any other policy
the view caches fit and reasons, and keys are computed on demand. The keys of a policy that reads
the workload mix or the load phase are re-checked on every node when either moves (``Policy.key_version``).
A policy with its own ``KeyIndex`` (``Capabilities.key_index``) keeps its keys there, one per node state
rather than per node: the views cache none of them, and a new mix costs them nothing.
"""

from __future__ import annotations

from dataclasses import replace

from extender.decide import Code, FitNote, PolicyUse, reason_for
from packing.ledger import Ledger
from packing.products import Request

MAX_VIEWS = 64  # request shapes come from the catalog (products x whole-card counts): few


class ShapeView:
    """One request shape against every node of the ledger."""

    __slots__ = ("dirty", "fits", "notes", "request")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.notes: dict[str, FitNote] = {}
        self.fits: set[str] = set()
        self.dirty: set[str] = set()


class FitCache:
    """Views per request shape over one ledger; the owner calls ``touch`` on every change of a node."""

    def __init__(self, ledger: Ledger, use: PolicyUse) -> None:
        self.ledger = ledger
        self.use = use
        self._views: dict[Request, ShapeView] = {}
        self._key_version = use.policy.key_version

    def touch(self, node: str) -> None:
        """``node`` changed (capacity, added, removed): every view re-checks it on next use."""
        for view in self._views.values():
            view.dirty.add(node)

    def view(self, request: Request) -> ShapeView:
        """The current view of ``request``: built on first use, refreshed where dirty. One view per
        shape whatever the pod's node constraints: a per-node fit does not read them (kube-scheduler
        filters by them before it asks us), and pods pinned many ways must not thrash the views."""
        if request.constraints is not None:
            request = replace(request, constraints=None)
        if self.use.view_keys and self.use.policy.key_version != self._key_version:
            self._key_version = self.use.policy.key_version
            for name in self.ledger.nodes:
                self.touch(name)
        view = self._views.get(request)
        if view is None:
            if len(self._views) >= MAX_VIEWS:
                del self._views[next(iter(self._views))]  # the oldest shape
            view = self._views[request] = ShapeView(request)
            for name in self.ledger.nodes:
                self._refresh(view, name)
        elif view.dirty:
            for name in view.dirty:
                self._refresh(view, name)
            view.dirty.clear()
        return view

    def warm(self, requests: list[Request]) -> None:
        """Build the views of ``requests`` now (start-up), so no filter pays for a cold view."""
        for r in requests:
            self.view(r)

    def _refresh(self, view: ShapeView, name: str) -> None:
        node = self.ledger.nodes.get(name)
        if node is None:
            view.notes.pop(name, None)
            view.fits.discard(name)
            return
        misfit = self.ledger.explain(view.request, name)
        if misfit is None:
            key = self.use.policy.node_key(self.ledger, view.request, node) if self.use.view_keys else None
            view.notes[name] = FitNote(None, "", True, key)
            view.fits.add(name)
        else:
            code = Code.of(misfit.code)
            view.notes[name] = FitNote(code, reason_for(code, view.request, misfit.code),
                                       misfit.resolvable)
            view.fits.discard(name)
