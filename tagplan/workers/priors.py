"""A job's search prior in a worker (docs/design.md §8-9).

A job records at submission which checkpoint guides its search (``options["prior"]``:
:data:`SHIPPED`, the checkpoint the package ships, or ``checkpoint:<id>``, the checkpoint
the registry had active), so every step and shard of the job uses the same weights even
when an operator activates another one meanwhile. A worker process loads each checkpoint
once and keeps it by that reference (its id is the digest of the file): a newly activated
checkpoint is a new reference, loaded when a job first names it. Worker processes run one
task at a time (prefork or solo pools), so a loaded prior is never used by two searches at
once.

A worker without torch searches with the uniform prior: the result's ``prior`` says
``uniform`` and its ``prior_note`` why. A checkpoint this version cannot use fails the job
with the reason (:class:`~tagplan.gnn.checkpoint.CheckpointRefused`). torch and the
planner are imported only when a prior is needed: the API imports this module for
:data:`SHIPPED` and :func:`checkpoint_reference`.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import TYPE_CHECKING

from tagplan.db.blobs import get_blob
from tagplan.db.models import Checkpoint
from tagplan.db.session import session_scope
from tagplan.planner.errors import InvalidInput

if TYPE_CHECKING:
    from tagplan.planner.search.prior import Prior

__all__ = ["SHIPPED", "checkpoint_reference", "job_prior", "preload"]

SHIPPED = "shipped"
"""The reference of the checkpoint the package ships (tagplan/gnn/checkpoints/prior.pt)."""
_CHECKPOINT = "checkpoint:"

log = logging.getLogger(__name__)


def checkpoint_reference(checkpoint_id: str) -> str:
    """The reference a job records for the uploaded checkpoint ``checkpoint_id``."""
    return f"{_CHECKPOINT}{checkpoint_id}"


def job_prior(url: str, reference: str) -> tuple[Prior, str | None]:
    """The prior of the job's ``reference`` (loaded once per process) and None, or, without
    torch, the uniform prior and a note saying what it stands in for."""
    from tagplan.gnn import gnn_available
    from tagplan.planner.search.prior import UniformPrior

    if not gnn_available():
        wanted = "the shipped checkpoint" if reference == SHIPPED else reference
        return UniformPrior(), f"torch is not installed on the worker: uniform prior, not {wanted}"
    if reference == SHIPPED:
        return _shipped(), None
    if not reference.startswith(_CHECKPOINT):
        raise InvalidInput(f"the job's prior {reference!r} names no checkpoint")
    return _uploaded(url, reference.removeprefix(_CHECKPOINT)), None


def preload() -> None:
    """Load torch and the shipped checkpoint before the first job, so no job's budget pays
    for them (seconds); a failure is logged, and the jobs that need the checkpoint fail
    with the reason."""
    from tagplan.gnn import gnn_available

    if not gnn_available():
        log.warning("torch is not installed: jobs search with the uniform prior")
        return
    try:
        log.info("search prior %s loaded", _shipped().name)
    except Exception:
        log.exception("the shipped checkpoint did not load")


@lru_cache(maxsize=1)
def _shipped() -> Prior:
    from tagplan.gnn import load_prior

    return load_prior()


@lru_cache(maxsize=4)
def _uploaded(url: str, checkpoint_id: str) -> Prior:
    """The prior of a stored checkpoint; a refusal (not cached) names the checkpoint by id
    (its name is the tenant's that uploaded it, not the job's)."""
    from tagplan.gnn import load_prior
    from tagplan.gnn.checkpoint import CheckpointRefused

    with session_scope(url) as session:
        row = session.get(Checkpoint, checkpoint_id)
        if row is None:
            raise InvalidInput(f"checkpoint {checkpoint_id} does not exist")
        data = get_blob(session, row.blob_digest)
    try:
        return load_prior(data)
    except CheckpointRefused as exc:
        raise CheckpointRefused(
            f"checkpoint {checkpoint_id[:12]} (active when the job was submitted) cannot guide "
            f"the search: {exc}"
        ) from None
