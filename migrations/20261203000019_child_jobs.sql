-- Child jobs (docs/configuration.md, "Child jobs"; docs/runs.md, "Child runs"): a job's
-- `on_success`, `on_failure` and `on_complete` lists name jobs that run once after each of its
-- runs ends that way. The database queues the ended run when it ends (chime_advances, by the
-- trigger that already wakes the leader when a run ends); the leader's outbox sweep takes the
-- queue under its fence and makes the child runs (chime_advance), which it then publishes like
-- any pending run. A child run is unique on (upstream run, job), so a repeated advance, a second
-- leader or an advance that crashed half-way never makes one twice.
-- Forward only: never edit an applied migration, add a new one.

-- The run that ended and made this one (trigger `child`).
ALTER TABLE chime_runs ADD COLUMN upstream_run_id bigint REFERENCES chime_runs (id)
    ON DELETE SET NULL;
ALTER TABLE chime_runs DROP CONSTRAINT chime_runs_trigger_check;
ALTER TABLE chime_runs ADD CONSTRAINT chime_runs_trigger_check
    CHECK (trigger IN ('schedule', 'catchup', 'manual', 'backfill', 'child')) NOT VALID;
ALTER TABLE chime_runs VALIDATE CONSTRAINT chime_runs_trigger_check;

-- One child run per upstream run and child job, whichever list named the job and however many
-- times the upstream run ended (a replayed dead run that then succeeds makes its on_success
-- children, not a second on_complete one).
CREATE UNIQUE INDEX chime_runs_upstream ON chime_runs (upstream_run_id, job_name)
    WHERE upstream_run_id IS NOT NULL;

-- The fire key names the triggers it covers: child runs carry their making instant, and two
-- upstream runs advanced in one statement make children of one job at the same now().
CREATE UNIQUE INDEX chime_runs_fire_key_new ON chime_runs (job_name, scheduled_at)
    WHERE trigger IN ('schedule', 'catchup', 'backfill') AND parent_id IS NULL;
DROP INDEX chime_runs_fire_key;
ALTER INDEX chime_runs_fire_key_new RENAME TO chime_runs_fire_key;

-- Ended runs whose children the leader has not made yet. A row is deleted in the statement that
-- makes the children, so it is handled exactly once under the fence.
CREATE TABLE chime_advances (
    run_id    bigint      PRIMARY KEY REFERENCES chime_runs (id) ON DELETE CASCADE,
    queued_at timestamptz NOT NULL DEFAULT now()
);

-- The child jobs a run ending in `state` starts, by the stored definition `spec`: on_success
-- and on_complete after `succeeded`; on_failure and on_complete after `failed`, `dead` or
-- `lost`; none after `cancelled` or `skipped` (an operator's decision, or nothing ran). Each job
-- once, in the order the lists name them.
CREATE FUNCTION chime_job_children(spec jsonb, state text) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT coalesce(array_agg(c.name ORDER BY c.ord), '{}')
      FROM (SELECT l.name, min(l.list * 1000 + l.n) AS ord
              FROM (SELECT 1 AS list, e.name, e.n
                      FROM jsonb_array_elements_text(
                               CASE WHEN jsonb_typeof(spec->'on_success') = 'array'
                                    THEN spec->'on_success' ELSE '[]' END)
                           WITH ORDINALITY AS e(name, n)
                     WHERE state = 'succeeded'
                    UNION ALL
                    SELECT 1, e.name, e.n
                      FROM jsonb_array_elements_text(
                               CASE WHEN jsonb_typeof(spec->'on_failure') = 'array'
                                    THEN spec->'on_failure' ELSE '[]' END)
                           WITH ORDINALITY AS e(name, n)
                     WHERE state IN ('failed', 'dead', 'lost')
                    UNION ALL
                    SELECT 2, e.name, e.n
                      FROM jsonb_array_elements_text(
                               CASE WHEN jsonb_typeof(spec->'on_complete') = 'array'
                                    THEN spec->'on_complete' ELSE '[]' END)
                           WITH ORDINALITY AS e(name, n)
                     WHERE state IN ('succeeded', 'failed', 'dead', 'lost')) l
             GROUP BY l.name) c
$$;
COMMENT ON FUNCTION chime_job_children(jsonb, text) IS
'Scheduler: the child jobs a run ending in `state` starts, by its job''s stored definition (on_success/on_failure, then on_complete; each once).';

-- As in migration 18, with one read of the job, and queueing the run for the leader's advance
-- when it ended with child jobs to start (tasks do not: their parent's end does).
CREATE OR REPLACE FUNCTION chime_run_finished_wake() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_spec jsonb;
BEGIN
    SELECT j.spec INTO v_spec FROM chime_jobs j WHERE j.name = NEW.job_name;
    IF chime_job_concurrency(v_spec) = 'queue' THEN
        PERFORM pg_notify('chime_outbox', 'finished ' || NEW.id);
    END IF;
    IF NEW.backfill_id IS NOT NULL THEN
        PERFORM pg_notify('chime_backfills', NEW.backfill_id::text);
    END IF;
    IF NEW.parent_id IS NULL AND cardinality(chime_job_children(v_spec, NEW.state)) > 0 THEN
        INSERT INTO chime_advances (run_id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
        PERFORM pg_notify('chime_outbox', 'advance ' || NEW.id);
    END IF;
    RETURN NULL;
END
$$;

-- Under the leader's fence: takes up to `batch` queued ended runs (oldest first, skipping rows
-- another transaction holds) and makes their child runs, `pending` at now() with the child
-- job's params (`skipped` while the child job is paused, the reason naming the upstream run).
-- Returns one row per child wanted: the run made (run_id NULL when it existed already), and
-- known = false for a child job that no longer exists (nothing made; the caller warns).
-- Notifies `chime_outbox` with `advance more` when the batch was full.
CREATE FUNCTION chime_advance(fence_holder text, fence_term bigint, batch integer)
RETURNS TABLE (upstream_id bigint, job_name text, run_id bigint, state text, known boolean)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    lease_term bigint;
    size constant integer := least(greatest(batch, 1), 10000);
    taken bigint[];
BEGIN
    SELECT f.term INTO lease_term FROM chime_fence(fence_holder, fence_term) f;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'lock_not_available',
            MESSAGE = format('lease lost (term %s no longer current)', fence_term);
    END IF;
    WITH d AS (
        DELETE FROM chime_advances a
         WHERE a.run_id IN (SELECT q.run_id FROM chime_advances q ORDER BY q.run_id LIMIT size
                               FOR UPDATE SKIP LOCKED)
        RETURNING a.run_id
    )
    SELECT coalesce(array_agg(d.run_id), '{}') INTO taken FROM d;
    IF cardinality(taken) = 0 THEN
        RETURN;
    END IF;
    IF cardinality(taken) >= size THEN
        PERFORM pg_notify('chime_outbox', 'advance more');
    END IF;
    RETURN QUERY
    WITH wanted AS (
        SELECT u.id AS upstream_id, c.name AS job_name, c.ord
          FROM chime_runs u
          JOIN chime_jobs uj ON uj.name = u.job_name
         CROSS JOIN LATERAL unnest(chime_job_children(uj.spec, u.state))
               WITH ORDINALITY AS c(name, ord)
         WHERE u.id = ANY (taken)
    ), made AS (
        INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state,
                                reason, term, upstream_run_id)
        SELECT j.name, j.group_name, now(), 'child', coalesce(j.spec->'params', 'null'),
               CASE WHEN j.paused THEN 'skipped' ELSE 'pending' END,
               CASE WHEN j.paused
                    THEN format('job %s is paused; not run after run %s', j.name, w.upstream_id)
               END,
               lease_term, w.upstream_id
          FROM wanted w JOIN chime_jobs j ON j.name = w.job_name
         ORDER BY w.upstream_id, w.ord
        ON CONFLICT (upstream_run_id, job_name) WHERE upstream_run_id IS NOT NULL DO NOTHING
        RETURNING chime_runs.id, chime_runs.job_name, chime_runs.upstream_run_id,
                  chime_runs.state
    )
    SELECT w.upstream_id, w.job_name, m.id, m.state, j.name IS NOT NULL
      FROM wanted w
      LEFT JOIN made m ON m.upstream_run_id = w.upstream_id AND m.job_name = w.job_name
      LEFT JOIN chime_jobs j ON j.name = w.job_name
     ORDER BY w.upstream_id, w.ord;
END
$$;
COMMENT ON FUNCTION chime_advance(text, bigint, integer) IS
'Scheduler: under the fence, takes up to `batch` ended runs queued in chime_advances and makes their child runs once; returns each child wanted (run made or NULL when it existed; known = false when its job is gone).';

-- For the handler of run `of_run`: the run that ended and made it (a child job's run), or the
-- one that made its fire when it is a task. `node` names a workflow node (none yet: NULL).
CREATE FUNCTION chime_upstream_runs(of_run bigint)
RETURNS TABLE (node text, run_id bigint, job_name text, state text, output jsonb, error text,
               finished_at timestamptz)
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
BEGIN
    PERFORM chime_require_runs(ARRAY[of_run]);
    RETURN QUERY
    SELECT NULL::text, u.id, u.job_name, u.state, u.output, u.error, u.finished_at
      FROM chime_runs r
      JOIN chime_runs f ON f.id = coalesce(r.parent_id, r.id)
      JOIN chime_runs u ON u.id = f.upstream_run_id
     WHERE r.id = of_run;
END
$$;
COMMENT ON FUNCTION chime_upstream_runs(bigint) IS
'Protocol: the run that ended and made of_run''s fire (trigger child): its id, job, state, output, error and end; none for other runs.';

-- ---- the worker role gets the new call -----------------------------------------------------

CREATE OR REPLACE FUNCTION chime_worker_functions() RETURNS SETOF regprocedure
LANGUAGE sql STABLE
AS $$
    SELECT f::regprocedure FROM unnest(ARRAY[
        'chime_claim(bigint[], integer[], text[], timestamptz[], text, text)',
        'chime_run_snapshot(bigint)',
        'chime_record_outcomes(bigint[], integer[], text[], bigint[], text[], text[], text[], timestamptz[], timestamptz[], text, bigint[], integer[], timestamptz[], text[], text[])',
        'chime_outcome_recorded(bigint, integer, text, text, bigint, text)',
        'chime_append_logs(bigint, integer, timestamptz[], text[], text[])',
        'chime_take_over(bigint, text, integer, text, text, boolean, integer, text, text)',
        'chime_mark_dead(bigint, text, text, text, text, integer)',
        'chime_mark_unhandled(bigint, text, text, text, integer)',
        'chime_handled_elsewhere(text, text, text)',
        'chime_register_worker(text, text, text, integer, text[], integer)',
        'chime_heartbeat(text)',
        'chime_worker_stopped(text)',
        'chime_retry_decision(bigint, integer, bigint)',
        'chime_trigger(text, jsonb, timestamptz, text, text)',
        'chime_map(bigint, integer, text, text, integer, jsonb[])',
        'chime_set_output(bigint, integer, text, jsonb)',
        'chime_task_results(bigint, bigint, integer)',
        'chime_upstream_runs(bigint)',
        'chime_may_act_for(text)',
        'chime_worker_online(timestamptz, timestamptz, integer)',
        'chime_worker_beat_deadline(timestamptz, integer)',
        'chime_retry_max_attempts(jsonb)',
        'chime_retry_exhausted(jsonb, integer)',
        'chime_run_ended(text)'
    ]) AS f
$$;

DO $$
DECLARE
    f regprocedure;
    g record;
BEGIN
    EXECUTE format('ALTER FUNCTION chime_upstream_runs(bigint) SECURITY DEFINER '
                   'SET search_path = %I, pg_temp', current_schema());
    FOREACH f IN ARRAY ARRAY['chime_job_children(jsonb, text)',
                             'chime_run_finished_wake()',
                             'chime_advance(text, bigint, integer)',
                             'chime_upstream_runs(bigint)']::regprocedure[] LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
    -- Roles granted before this migration get the new call as chime_grant_worker would.
    FOR g IN SELECT DISTINCT gr.role FROM chime_worker_grants gr
               JOIN pg_roles r ON r.rolname = gr.role LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION chime_upstream_runs(bigint) TO %I', g.role);
    END LOOP;
END
$$;
