"""The worker's two hot transitions on PostgreSQL, each one statement.

A claim and a completion each touch several tables: the job's compare-and-set, its
attempt row, the webhook event of the transition with a delivery per interested target,
and (a claim) the tenant's fair-share pass and the lane's clock, or (a completion) the
outputs and the usage record. Written as separate statements that is eight to eleven
round trips, each with its share of Python, on the path between a submit and its
answer. Here each transition is one statement of data-modifying CTEs: every part keyed
on the row the compare-and-set returned, so a lost race writes nothing at all.

The statements are built on first use, not at import: building them is a fifth of a
second of Python that the API and the maintenance process, which never claim or
complete, would pay at every start.

What stays a statement of its own: the claim first locks its lane's clock row (and
finds the lane from the message's token), because a statement's snapshot is taken when
it starts: the pick must see every claim that took the lane before it. SQLite runs the
same transitions statement by statement (``JobRepository``'s generic path), and the
repository tests run both.
"""

from __future__ import annotations

from functools import cache

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    String,
    and_,
    bindparam,
    case,
    cast,
    column,
    exists,
    func,
    insert,
    literal,
    null,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSONB

from core.batches import BULK_LANE
from core.jobs import JobStatus

from ..models import (
    Job,
    JobAttempt,
    JobUsage,
    JobWebhook,
    LaneClock,
    Output,
    Tenant,
    TenantService,
    UTCDateTime,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)
from ..records import MAIN
from . import fair
from .attempts import COMPLETED as ATTEMPT_COMPLETED
from .webhook_log import PENDING

# Parameters are named apart from every column (``p_...``): a parameter named as a
# column of a table a CTE writes would be taken as that column's value.
_NOW = bindparam("now", type_=UTCDateTime())


@cache
def lock_lane():
    """Lock the lane of the queued job holding ``:token`` (its clock row, made on first
    use) and return the lane and its time; no row: nothing holds the token."""
    h = Job.__table__.alias("h")
    lane = case((h.c.batch_id.is_(None), literal(fair.INTERACTIVE)), else_=literal(BULK_LANE))
    holder = (select(h.c.pipeline, lane, literal(0.0, Float))
              .where(h.c.dispatch_token == bindparam("token"), h.c.status == fair._QUEUED)
              .limit(1))
    stmt = postgresql.insert(LaneClock).from_select(["pipeline", "lane", "vtime"], holder)
    return stmt.on_conflict_do_update(
        index_elements=["pipeline", "lane"], set_={"vtime": LaneClock.vtime}).returning(
        LaneClock.pipeline, LaneClock.lane, LaneClock.vtime)


def _matches(types_column, event_type):
    """``event_type`` is one of a JSON list column's strings."""
    return cast(types_column, JSONB).contains(func.jsonb_build_array(event_type))


def _stage_event(subject, event: str, when):
    """CTEs that write ``subject``'s (one job row) webhook event and one delivery per
    interested target, as ``webhooks.stage_job_event`` does: none for a batch's job (its
    batch reports it), ``started`` for the first attempt only, and no event without a
    target. ``:p_event`` names it."""
    event_type = subject.c.kind + literal("." + event)
    own = (select(null().label("endpoint_id"), JobWebhook.url.label("url"),
                  subject.c.id.label("target"))
           .join_from(subject, JobWebhook, JobWebhook.job_id == subject.c.id)
           .where(JobWebhook.stopped_at.is_(None), _matches(JobWebhook.event_types, event_type)))
    registered = (select(WebhookEndpoint.id, null(), WebhookEndpoint.id)
                  .join_from(subject, WebhookEndpoint,
                             WebhookEndpoint.tenant_id == subject.c.tenant_id)
                  .where(WebhookEndpoint.disabled_at.is_(None),
                         _matches(WebhookEndpoint.event_types, event_type)))
    targets = union_all(own, registered).cte(f"{event}_targets")
    reported = [subject.c.batch_id.is_(None), exists(select(targets.c.target))]
    if event == "started":
        reported.append(subject.c.attempts == 1)
    staged = insert(WebhookEvent).from_select(
        ["id", "tenant_id", "job_id", "type", "created_at"],
        select(bindparam("p_event", type_=String), subject.c.tenant_id, subject.c.id,
               event_type, when).where(*reported)).returning(WebhookEvent.id).cte(
        f"{event}_event")
    sent = insert(WebhookDelivery).from_select(
        ["event_id", "endpoint_id", "url", "target", "status", "attempts", "next_attempt_at",
         "created_at", "updated_at"],
        select(staged.c.id, targets.c.endpoint_id, targets.c.url, targets.c.target,
               literal(PENDING), literal(0), when, when, when).select_from(
            staged.join(targets, true()))
    ).returning(WebhookDelivery.id).cte(f"{event}_deliveries")
    return [staged, sent]


def _claim(lane: str, returning):
    """The fair claim of ``lane`` (``fair.claim_statement``, ``:p_vtime`` the clock the lock
    returned) with everything a claim writes, returning the claimed row."""
    claimed = fair.claim_statement(lane, returning, walk=True).cte("claimed")
    token = bindparam("token")
    handed = update(Job).where(
        Job.dispatch_token == token, Job.status == fair._QUEUED, Job.id != claimed.c.id,
        claimed.c.dispatch_token != token).values(
        dispatch_token=claimed.c.dispatch_token).returning(Job.id).cte("handed")
    standing = (select(claimed.c.tenant_id, Tenant.share_weight.label("weight"),
                       fair.larger(func.coalesce(TenantService.pass_, 0.0),
                                   bindparam("p_vtime")).label("served_at"))
                .join_from(claimed, Tenant, Tenant.id == claimed.c.tenant_id)
                .outerjoin(TenantService, and_(
                    TenantService.tenant_id == Tenant.id,
                    TenantService.pipeline == bindparam("p_pipeline"),
                    TenantService.lane == literal(lane)))
                .cte("standing"))
    served = postgresql.insert(TenantService).from_select(
        ["pipeline", "lane", "tenant_id", "pass"],
        select(bindparam("p_pipeline"), literal(lane), standing.c.tenant_id,
               standing.c.served_at + 1.0 / fair.larger(standing.c.weight, literal(1e-6))))
    served = served.on_conflict_do_update(
        index_elements=["pipeline", "lane", "tenant_id"],
        set_={"pass": served.excluded["pass"]}).returning(TenantService.tenant_id).cte("served")
    advance = update(LaneClock).where(
        LaneClock.pipeline == bindparam("p_pipeline"), LaneClock.lane == literal(lane),
        exists(select(standing.c.tenant_id))).values(  # only when it claimed
        vtime=select(standing.c.served_at).scalar_subquery()).returning(
        LaneClock.lane).cte("advance")
    attempt = insert(JobAttempt).from_select(
        ["job_id", "attempt", "worker_id", "claimed_at"],
        select(claimed.c.id, claimed.c.attempts, bindparam("p_worker"), _NOW)
    ).returning(JobAttempt.job_id).cte("attempt")
    return select(claimed).add_cte(handed, served, advance, attempt,
                                   *_stage_event(claimed, "started", _NOW))


@cache
def claim(lane: str):
    """The claim statement of ``lane`` (``_claim``), built once."""
    return _claim(lane, fair.CLAIMED)


def _outputs(done):
    """The outputs, handed in as one JSON list (``:outputs``) and inserted for ``done``."""
    typed = [column(c.name, c.type) for c in Output.__table__.columns
             if c.name not in ("id", "job_id", "created_at")]
    rows = func.json_to_recordset(bindparam("p_outputs", type_=JSON)).table_valued(
        *typed).render_derived(name="o", with_types=True)
    names = [c.name for c in typed]
    return insert(Output).from_select(
        ["job_id", "created_at", *names],
        select(done.c.id, _NOW, *(rows.c[n] for n in names)).select_from(
            done.join(rows, true()))
    ).returning(Output.id).cte("outs")


def _usage(done, closed):
    """The job's usage record, as ``usage.settle`` rebuilds it: every attempt's time
    (this one's as the worker measured it), the part no output came of, the last device
    known, and the media of the outputs (``:p_audio`` ...: summed by the caller, who
    holds them)."""
    a = JobAttempt
    earlier = and_(a.job_id == bindparam("p_job"), a.attempt != bindparam("p_attempt"))
    prior = select(
        func.coalesce(func.sum(a.render_s), 0.0).label("render"),
        func.coalesce(func.sum(a.render_s).filter(
            func.coalesce(a.outcome, "") != ATTEMPT_COMPLETED), 0.0).label("failed"),
    ).where(earlier).cte("prior")
    last_device = (select(a.device).where(earlier, a.device.is_not(None))
                   .order_by(a.attempt.desc()).limit(1).scalar_subquery())
    request = done.c.request
    text = func.coalesce(func.nullif(request["input"].as_string(), ""),
                         func.nullif(request["prompt"].as_string(), ""), "")
    values = {
        "job_id": done.c.id, "tenant_id": done.c.tenant_id, "kind": done.c.kind,
        "model": done.c.model, "pipeline": done.c.pipeline, "batch_id": done.c.batch_id,
        "status": literal(JobStatus.COMPLETED.value), "finished_at": _NOW,
        "attempts": done.c.attempts,
        "render_s": prior.c.render + func.coalesce(closed.c.render_s, 0.0),
        "failed_render_s": prior.c.failed,
        "device": func.coalesce(closed.c.device, last_device),
        "characters": func.length(text), "audio_s": bindparam("p_audio", type_=Float),
        "video_s": bindparam("p_video", type_=Float), "frames": bindparam("p_frames"),
        "bytes": bindparam("p_bytes"),
    }
    stmt = postgresql.insert(JobUsage).from_select(
        list(values), select(*values.values()).select_from(
            done.outerjoin(closed, true()).join(prior, true())))
    return stmt.on_conflict_do_update(
        index_elements=["job_id"],
        set_={k: stmt.excluded[k] for k in values if k != "job_id"}).returning(
        JobUsage.job_id).cte("usage")


@cache
def complete():
    """running -> completed on attempt ``:attempt``, with the outputs, the attempt's end
    and time (``:timed``: the worker measured it), the usage record and the
    ``completed`` event; returns the job's id, or nothing if the attempt lost."""
    done = update(Job).where(
        Job.id == bindparam("p_job"), Job.status == JobStatus.RUNNING.value,
        Job.attempts == bindparam("p_attempt")).values(
        status=JobStatus.COMPLETED.value, progress=100, completed_at=_NOW, updated_at=_NOW,
        lease_expires_at=None, expires_at=bindparam("p_expires", type_=UTCDateTime())
    ).returning(Job.id, Job.tenant_id, Job.kind, Job.model, Job.pipeline, Job.batch_id,
                Job.attempts, Job.request).cte("done")
    timed = bindparam("timed", type_=Boolean)
    closed = update(JobAttempt).where(
        JobAttempt.job_id == done.c.id, JobAttempt.ended_at.is_(None)).values(
        ended_at=_NOW, outcome=ATTEMPT_COMPLETED, error_code=None, error_message=None,
        render_s=case((timed, bindparam("p_render", type_=Float)), else_=JobAttempt.render_s),
        device=case((timed, bindparam("p_device", type_=String)), else_=JobAttempt.device),
    ).returning(JobAttempt.render_s, JobAttempt.device).cte("closed")
    return select(done.c.id).add_cte(_outputs(done), closed, _usage(done, closed),
                                     *_stage_event(done, "completed", _NOW))


def media(outputs) -> dict:
    """The usage record's media figures from the outputs (a video's previews are not
    media): what ``usage.settle`` sums from the stored rows."""
    main = [o for o in outputs if o.variant == MAIN]
    return {"p_audio": sum((o.duration_s or 0.0) for o in main if o.sample_rate),
            "p_video": sum((o.duration_s or 0.0) for o in main if o.frames),
            "p_frames": sum((o.frames or 0) for o in main),
            "p_bytes": sum(o.bytes for o in main)}
