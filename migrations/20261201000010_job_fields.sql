-- The fields of a stored job definition (`chime_jobs.spec`, the JobSpec's serde form) that SQL
-- reads, each read in one place. A definition without the field has the JobSpec's default.
-- LANGUAGE sql and IMMUTABLE, so the planner inlines the body: plans stay as with the
-- expression written out.

-- The job's concurrency policy: 'allow' (the default), 'forbid', 'queue' or 'replace'.
-- `allow` when `spec` is NULL, as for a run whose job no longer exists.
CREATE FUNCTION chime_job_concurrency(spec jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT coalesce(spec->>'concurrency', 'allow') $$;

-- As in migration 4, reading the policy through the function above.
CREATE OR REPLACE FUNCTION chime_run_finished_wake() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM chime_jobs
               WHERE name = NEW.job_name AND chime_job_concurrency(spec) = 'queue') THEN
        PERFORM pg_notify('chime_outbox', 'finished ' || NEW.id);
    END IF;
    RETURN NULL;
END
$$;
