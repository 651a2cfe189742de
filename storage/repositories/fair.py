"""Fair share inside a lane: which queued job a free worker takes.

A render message is a wake-up for its pipeline's lane, not an order to run one job: the
worker that takes it claims the oldest ready job of the waiting tenant with the least
service in that lane (stride scheduling: every claim adds ``1 / share_weight`` to the
tenant's pass; the lowest pass goes next, ties to the older job). A tenant returning
after a pause starts at the lane's clock (the pass last served), never below it, so it
cannot replay the service it missed. The dispatch tokens still decide which messages
count: a message wakes the lane only while some queued job holds its token, and when
it claims a job other than that holder, the holder takes over the claimed job's token
(whose message is still on its way), so every queued job keeps exactly one message.

One statement claims (``pick``); the lane's clock row, locked first, makes the claims
of one lane take turns (PostgreSQL: a row lock; SQLite: its single writer), so the
service figures they read are never stale. ``FOR UPDATE SKIP LOCKED`` passes over a
job some other transaction holds (a cancel); if the fairest tenant's jobs are all held,
the lane's oldest job is taken instead, so a wake-up never goes unused.
"""

from __future__ import annotations

from sqlalchemy import and_, bindparam, case, func, literal_column, or_, select, true, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, aliased

from core.batches import BULK_LANE
from core.jobs import JobStatus

from ..models import Job, LaneClock, Tenant, TenantService, UTCDateTime
from .quotas import INTERACTIVE

LANES = (INTERACTIVE, BULK_LANE)
# Literals, not parameters: the partial indexes' own predicates, so a cached plan can
# still use them.
_QUEUED = literal_column("'queued'")


# The claimed row as plain columns, named as ``JobRepository``'s records read them: no ORM
# entity to build, track and then load relationships for (a claimed job has no outputs).
CLAIMED = [c.label(a.key) for a in Job.__mapper__.column_attrs for c in a.columns]


def lane_of(batch_id: str | None) -> str:
    return INTERACTIVE if batch_id is None else BULK_LANE


def queued(j, lane: str, pipeline=None):
    """``j`` (an alias of jobs) is queued in ``lane`` of ``:pipeline`` (or of
    ``pipeline``): the predicates of the lane's index, ``ix_jobs_fair_<lane>``."""
    in_lane = j.batch_id.is_(None) if lane == INTERACTIVE else j.batch_id.is_not(None)
    return and_(j.pipeline == (bindparam("p_pipeline") if pipeline is None else pipeline),
                j.status == _QUEUED, in_lane)


def ready(j):
    """``j`` is past any retry backoff."""
    return or_(j.ready_at.is_(None), j.ready_at <= bindparam("now", type_=UTCDateTime()))


def waiting(j, lane: str, pipeline=None):
    """``j`` is queued in ``lane`` of ``:pipeline`` (or of ``pipeline``), and ready."""
    return and_(queued(j, lane, pipeline), ready(j))


def larger(a, b):
    """``greatest(a, b)`` in both dialects."""
    return case((a > b, a), else_=b)


def _oldest_ready(lane: str, tenant_id):
    """The created_at of ``tenant_id``'s oldest ready job in the lane (one index probe)."""
    q = aliased(Job, name="q")
    return (select(q.created_at).where(waiting(q, lane), q.tenant_id == tenant_id)
            .order_by(q.created_at).limit(1).scalar_subquery())


def _keyed(lane: str, tenant_id, oldest):
    """Per tenant its key (pass, raised to the lane's clock ``:p_vtime``) and its oldest
    ready job (NULL: nothing ready), for ``ORDER BY key, oldest``."""
    key = larger(func.coalesce(TenantService.pass_, 0.0), bindparam("p_vtime"))
    return select(tenant_id.label("tenant_id"), oldest.label("oldest"), key.label("key")
                  ).outerjoin(TenantService, and_(
                      TenantService.pipeline == bindparam("p_pipeline"),
                      TenantService.lane == literal_column(f"'{lane}'"),
                      TenantService.tenant_id == tenant_id))


def _tenant_order(lane: str):
    """SQLite (the embedded mode, a handful of tenants): every tenant, one index probe
    each (ix_jobs_fair_*)."""
    return _keyed(lane, Tenant.id, _oldest_ready(lane, Tenant.id)).subquery("t")


def _first_queued(lane: str, name: str, after=None):
    """The first entry of the lane's index (after tenant ``after``): a tenant and its
    oldest queued job's created_at and ready_at."""
    j = aliased(Job, name=name)
    where = [queued(j, lane)] + ([j.tenant_id > after] if after is not None else [])
    return (select(j.tenant_id, j.created_at, j.ready_at).where(*where)
            .order_by(j.tenant_id, j.created_at).limit(1))


def _waiting_order(lane: str):
    """PostgreSQL: only the tenants with a job queued in the lane, found by walking the
    lane's index from one tenant to the next (a recursive CTE, one probe per waiting
    tenant), so a claim costs the same however many tenants exist. Each step reads the
    tenant's oldest queued job; only when that one is in its retry backoff does a second
    probe look for the oldest ready one."""
    walk = _first_queued(lane, "q").cte("walk", recursive=True)
    step = _first_queued(lane, "n", after=walk.c.tenant_id).lateral("step")
    walk = walk.union_all(select(*step.c).select_from(walk).join(step, true()))
    oldest = case((ready(walk.c), walk.c.created_at),
                  else_=_oldest_ready(lane, walk.c.tenant_id))
    return _keyed(lane, walk.c.tenant_id, oldest).subquery("t")


def _pick(lane: str, walk: bool):
    t = _waiting_order(lane) if walk else _tenant_order(lane)
    # Tenants with nothing ready sort last (a filter would probe each tenant twice).
    fairest = (select(t.c.tenant_id).order_by(t.c.oldest.is_(None), t.c.key, t.c.oldest)
               .limit(1).scalar_subquery())
    j, f = aliased(Job, name="j"), aliased(Job, name="f")
    fair = (select(j.id).where(waiting(j, lane), j.tenant_id == fairest)
            .order_by(j.created_at, j.id).limit(1)
            .with_for_update(skip_locked=True).scalar_subquery())
    oldest = (select(f.id).where(waiting(f, lane)).order_by(f.created_at, f.id).limit(1)
              .with_for_update(skip_locked=True).scalar_subquery())
    return func.coalesce(fair, oldest)


def claim_statement(lane: str, returning, walk: bool = False):
    """queued -> running for the fairest ready job of ``:pipeline``'s ``lane``, while some
    queued job holds ``:token`` (the message is current), returning the row. ``walk``
    (PostgreSQL): consider only the tenants waiting in the lane (``_waiting_order``)."""
    h = aliased(Job, name="h")
    current = select(h.id).where(h.dispatch_token == bindparam("token"),
                                 h.status == _QUEUED).exists()
    now = bindparam("now", type_=UTCDateTime())
    return update(Job).where(Job.id == _pick(lane, walk), Job.status == _QUEUED, current).values(
        status=JobStatus.RUNNING.value, attempts=Job.attempts + 1,
        worker_id=bindparam("p_worker"),
        lease_expires_at=bindparam("lease", type_=UTCDateTime()), updated_at=now,
        started_at=func.coalesce(Job.started_at, now), error_code=None,
        error_message=None).returning(*returning)


# The holder of the consumed message's token takes the claimed job's token.
HAND_OVER = update(Job).where(Job.dispatch_token == bindparam("token"),
                              Job.status == _QUEUED).values(
    dispatch_token=bindparam("claimed_token"))

# The message's lane: the queued job holding its token (none: a superseded message).
HOLDER = select(Job.pipeline, Job.batch_id).where(
    Job.dispatch_token == bindparam("token"), Job.status == _QUEUED).limit(1)


def _clock(dialect):
    stmt = dialect.insert(LaneClock).values(pipeline=bindparam("p_pipeline"),
                                            lane=bindparam("p_lane"), vtime=0.0)
    return stmt.on_conflict_do_update(index_elements=["pipeline", "lane"],
                                      set_={"vtime": stmt.excluded.vtime + LaneClock.vtime}
                                      ).returning(LaneClock.vtime)


def _served(dialect):
    stmt = dialect.insert(TenantService).values(
        pipeline=bindparam("p_pipeline"), lane=bindparam("p_lane"),
        tenant_id=bindparam("p_tenant"), pass_=bindparam("new_pass"))
    return stmt.on_conflict_do_update(index_elements=["pipeline", "lane", "tenant_id"],
                                      set_={"pass": stmt.excluded["pass"]})


# ``vtime = 0 + vtime``: a write that changes nothing, so the row is locked (and made
# on first use) by the statement that reads it.
_CLOCK = {"postgresql": _clock(postgresql), "sqlite": _clock(sqlite)}
_SERVED = {"postgresql": _served(postgresql), "sqlite": _served(sqlite)}
_ADVANCE = update(LaneClock).where(LaneClock.pipeline == bindparam("p_pipeline"),
                                   LaneClock.lane == bindparam("p_lane")).values(
    vtime=bindparam("vtime"))
_STANDING = select(Tenant.share_weight, TenantService.pass_).outerjoin(
    TenantService, and_(TenantService.tenant_id == Tenant.id,
                        TenantService.pipeline == bindparam("p_pipeline"),
                        TenantService.lane == bindparam("p_lane"))).where(
    Tenant.id == bindparam("p_tenant"))


def lock_lane(s: Session, pipeline: str, lane: str) -> float:
    """Lock the lane's clock row (made on first use) and return its time."""
    conn = s.connection()
    return conn.execute(_CLOCK[conn.dialect.name],
                        {"p_pipeline": pipeline, "p_lane": lane}).scalar_one()


def charge(s: Session, pipeline: str, lane: str, tenant_id: str, vtime: float) -> None:
    """The claim served ``tenant_id``: its pass moves on by its stride, and the lane's
    clock to the pass it was served at."""
    conn = s.connection()
    where = {"p_pipeline": pipeline, "p_lane": lane, "p_tenant": tenant_id}
    weight, passed = conn.execute(_STANDING, where).one()
    served_at = max(passed or 0.0, vtime)
    conn.execute(_SERVED[conn.dialect.name],
                 {**where, "new_pass": served_at + 1.0 / max(weight, 1e-6)})
    conn.execute(_ADVANCE, {**where, "vtime": served_at})
