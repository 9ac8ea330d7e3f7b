-- Backfills (docs/operations.md, "Backfilling a range"): the fires a job's schedule has in a past
-- range, made into runs as one batch by the leader, at most `parallel` of them unfinished at
-- once. A fire that has a run already (scheduled, caught up, or another backfill's) keeps it:
-- the fire key (job, scheduled instant) makes a second run of it impossible, so a repeated or
-- overlapping backfill creates none.
--
-- States: running -> done (every fire of the range has a run and every run it made has ended)
--                 -> cancelled (by an operator, or because its job was deleted; `reason` says)
CREATE TABLE chime_backfills (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_name       text        NOT NULL,
    -- The range: fires at or after from_at and before to_at.
    from_at        timestamptz NOT NULL,
    to_at          timestamptz NOT NULL CHECK (to_at > from_at),
    -- Runs of this backfill unfinished at once, at most (1: one after the other).
    parallel       integer     NOT NULL CHECK (parallel BETWEEN 1 AND 100),
    -- Runs it makes per second, at most.
    rate           integer     NOT NULL CHECK (rate BETWEEN 1 AND 1000),
    -- Named `status`, not `state`: a run's states are another set.
    status         text        NOT NULL DEFAULT 'running'
                               CHECK (status IN ('running', 'done', 'cancelled')),
    -- The fires of the range when it was requested; made + existing reach it when every one
    -- has been handled (unless the job's schedule changed meanwhile).
    fires_total    integer     NOT NULL CHECK (fires_total >= 0),
    -- Runs this backfill created, and fires it found with a run already.
    fires_made     integer     NOT NULL DEFAULT 0,
    fires_existing integer     NOT NULL DEFAULT 0,
    -- Every fire at or before this instant has been handled; NULL: none yet. to_at once every
    -- fire of the range has been.
    cursor_at      timestamptz,
    requested_by   text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    reason         text,
    cancelled_by   text
);
-- The leader's duty reads the running ones every pass.
CREATE INDEX chime_backfills_running ON chime_backfills (id) WHERE status = 'running';
-- The list, newest first, by job.
CREATE INDEX chime_backfills_job ON chime_backfills (job_name, id DESC);

-- The batch a run belongs to; its trigger is `backfill`.
ALTER TABLE chime_runs ADD COLUMN backfill_id bigint REFERENCES chime_backfills (id);
ALTER TABLE chime_runs DROP CONSTRAINT chime_runs_trigger_check;
ALTER TABLE chime_runs ADD CONSTRAINT chime_runs_trigger_check
    CHECK (trigger IN ('schedule', 'catchup', 'manual', 'backfill')) NOT VALID;
ALTER TABLE chime_runs VALIDATE CONSTRAINT chime_runs_trigger_check;
-- A backfill's runs by state: its progress, and how many are unfinished (its parallel limit);
-- and its runs newest first (GET /api/runs?backfill=ID, by keyset). Partial: other runs pay
-- nothing for them.
CREATE INDEX chime_runs_backfill_state ON chime_runs (backfill_id, state)
    WHERE backfill_id IS NOT NULL;
CREATE INDEX chime_runs_backfill ON chime_runs (backfill_id, id) WHERE backfill_id IS NOT NULL;

-- As in migration 10, and also waking the leader's backfill duty when a run of a backfill
-- ends, so the next fire of a serial backfill starts at once.
CREATE OR REPLACE FUNCTION chime_run_finished_wake() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM chime_jobs
               WHERE name = NEW.job_name AND chime_job_concurrency(spec) = 'queue') THEN
        PERFORM pg_notify('chime_outbox', 'finished ' || NEW.id);
    END IF;
    IF NEW.backfill_id IS NOT NULL THEN
        PERFORM pg_notify('chime_backfills', NEW.backfill_id::text);
    END IF;
    RETURN NULL;
END
$$;
