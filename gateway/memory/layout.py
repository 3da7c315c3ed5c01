"""Which order a composition forwards its context in (pure): the cache-stable layout
(``stable_layout``) when it has one, else one memory message rebuilt every turn
(``assemble``). Both take the same arguments and give the same ``Context``."""

from __future__ import annotations

from typing import Any

from gateway.memory.assemble import Context, assemble
from gateway.memory.reconcile import Reconciled
from gateway.memory.stable_layout import assemble_stable
from gateway.presets import Composition


def build_context(turn: Reconciled, *, composition: Composition, **parts: Any) -> Context:
    """The context to forward for ``turn`` (see ``assemble`` for ``parts``)."""
    build = assemble if composition.stable is None else assemble_stable
    return build(turn, composition=composition, **parts)
