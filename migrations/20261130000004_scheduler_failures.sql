-- Scheduler side of failure handling: concurrency policies, alert de-duplication, and a wake-up
-- for runs that waited behind another run of their job (concurrency = "queue").

-- Runs of a job that have not finished yet, pending included: `forbid` skips a fire while one
-- exists, `queue` holds a pending run back while an earlier one exists.
CREATE INDEX chime_runs_unfinished ON chime_runs (job_name, id)
    WHERE state IN ('pending', 'queued', 'running', 'retrying');

-- Alerts: which attempt an alert is about, and whether the rate limit held it back (recorded
-- anyway, so operators see it and a new leader does not send it again).
ALTER TABLE chime_alerts ADD COLUMN attempt integer;
ALTER TABLE chime_alerts ADD COLUMN suppressed boolean NOT NULL DEFAULT false;
-- One alert per event (kind, run, attempt), whichever leader sees it.
CREATE UNIQUE INDEX chime_alerts_event ON chime_alerts (kind, run_id, coalesce(attempt, 0))
    WHERE run_id IS NOT NULL;

-- When a run of a `queue`-policy job finishes, wake the leader's outbox sweep at once so the
-- next queued run of the job is published without waiting for the next periodic sweep.
CREATE FUNCTION chime_run_finished_wake() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM chime_jobs
               WHERE name = NEW.job_name AND spec->>'concurrency' = 'queue') THEN
        PERFORM pg_notify('chime_outbox', 'finished ' || NEW.id);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER chime_runs_finished_wake
    AFTER UPDATE OF state ON chime_runs
    FOR EACH ROW
    WHEN (OLD.state IN ('pending', 'queued', 'running', 'retrying')
          AND NEW.state NOT IN ('pending', 'queued', 'running', 'retrying'))
    EXECUTE FUNCTION chime_run_finished_wake();
