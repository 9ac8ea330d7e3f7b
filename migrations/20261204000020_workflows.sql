-- Workflows (docs/workflows.md): a job of kind `workflow` whose fire runs a DAG of other jobs'
-- runs. The workflow run is a run of the workflow job (so schedules, misfire, concurrency,
-- manual triggers with params, pause and retention are those of any job); each node's run is a
-- run of the node's job with `workflow_run_id`, `node` and `node_round`, unique on the three,
-- so no repeated advance, second leader or advance that crashed half-way makes a node twice.
-- A node run's end queues its workflow run (chime_workflow_advances, by the trigger that
-- already wakes the leader when a run ends); the leader's outbox sweep advances it under its
-- fence (`crate::store::workflows`), in the transaction that deletes the queue row.
-- Forward only: never edit an applied migration, add a new one.

ALTER TABLE chime_runs
    ADD COLUMN workflow_run_id bigint REFERENCES chime_runs (id) ON DELETE CASCADE,
    ADD COLUMN node            text,
    ADD COLUMN node_round      integer,
    -- A running workflow run ends `failed` past this instant (its timeout).
    ADD COLUMN deadline_at     timestamptz;
ALTER TABLE chime_runs ADD CONSTRAINT chime_runs_node_check
    CHECK ((workflow_run_id IS NULL) = (node IS NULL) AND (node IS NULL) = (node_round IS NULL))
    NOT VALID;
ALTER TABLE chime_runs VALIDATE CONSTRAINT chime_runs_node_check;
ALTER TABLE chime_runs DROP CONSTRAINT chime_runs_trigger_check;
ALTER TABLE chime_runs ADD CONSTRAINT chime_runs_trigger_check
    CHECK (trigger IN ('schedule', 'catchup', 'manual', 'backfill', 'child', 'workflow')) NOT VALID;
ALTER TABLE chime_runs VALIDATE CONSTRAINT chime_runs_trigger_check;

-- One run per workflow run, node and round (a rerun from a node starts a new round for it and
-- the nodes after it; the earlier rounds' runs stay as history).
CREATE UNIQUE INDEX chime_runs_node ON chime_runs (workflow_run_id, node, node_round)
    WHERE workflow_run_id IS NOT NULL;
-- Running workflow runs with a timeout, for the sweep's deadline check.
CREATE INDEX chime_runs_deadline ON chime_runs (deadline_at)
    WHERE deadline_at IS NOT NULL AND state = 'running';

-- Each rerun of a workflow run: its round, the node it reran from and every node it reran.
CREATE TABLE chime_workflow_reruns (
    run_id bigint      NOT NULL REFERENCES chime_runs (id) ON DELETE CASCADE,
    round  integer     NOT NULL CHECK (round > 0),
    node   text        NOT NULL,
    nodes  text[]      NOT NULL,
    at     timestamptz NOT NULL DEFAULT now(),
    actor  text        NOT NULL,
    PRIMARY KEY (run_id, round)
);

-- Workflow runs to advance: a node run ended, the run was cancelled or reran. A row is deleted
-- in the transaction that advances the run, under the fence.
CREATE TABLE chime_workflow_advances (
    run_id    bigint      PRIMARY KEY REFERENCES chime_runs (id) ON DELETE CASCADE,
    queued_at timestamptz NOT NULL DEFAULT now()
);

-- As in migration 19; a node run's end queues its workflow run instead of child jobs (a node's
-- job's own child lists do not apply inside a workflow: the workflow says what follows).
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
    IF NEW.workflow_run_id IS NOT NULL THEN
        INSERT INTO chime_workflow_advances (run_id) VALUES (NEW.workflow_run_id)
            ON CONFLICT DO NOTHING;
        PERFORM pg_notify('chime_outbox', 'advance w' || NEW.workflow_run_id);
    ELSIF NEW.parent_id IS NULL AND cardinality(chime_job_children(v_spec, NEW.state)) > 0 THEN
        INSERT INTO chime_advances (run_id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
        PERFORM pg_notify('chime_outbox', 'advance ' || NEW.id);
    END IF;
    RETURN NULL;
END
$$;

-- A cancel of a workflow run is a cancel of its unfinished node runs: those not started end
-- `cancelled` at once, running ones get the request (the operator's cancel tells their
-- workers). The run is queued for its advance, which ends it `cancelled` (or `failed`, for a
-- timeout) when its last node has ended.
CREATE FUNCTION chime_workflow_cancelled() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM chime_jobs j
                    WHERE j.name = NEW.job_name AND chime_job_kind(j.spec) = 'workflow') THEN
        RETURN NULL;
    END IF;
    UPDATE chime_runs t
       SET cancel_requested_at = coalesce(NEW.cancel_requested_at, now()),
           cancel_requested_by = coalesce(NEW.cancel_requested_by, 'cancel of workflow run ' || NEW.id),
           state = CASE WHEN t.state IN ('pending', 'queued', 'retrying') THEN 'cancelled'
                        ELSE t.state END,
           finished_at = CASE WHEN t.state IN ('pending', 'queued', 'retrying') THEN now()
                              ELSE t.finished_at END,
           next_attempt_at = CASE WHEN t.state = 'retrying' THEN NULL ELSE t.next_attempt_at END
     WHERE t.workflow_run_id = NEW.id AND NOT chime_run_ended(t.state)
       AND t.cancel_requested_at IS NULL;
    INSERT INTO chime_workflow_advances (run_id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
    PERFORM pg_notify('chime_outbox', 'advance w' || NEW.id);
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION chime_workflow_cancelled() IS
'Scheduler: passes a cancel of a workflow run on to its unfinished node runs and queues its advance (trigger chime_runs_workflow_cancelled).';

CREATE TRIGGER chime_runs_workflow_cancelled
    AFTER UPDATE OF cancel_requested_at ON chime_runs
    FOR EACH ROW
    WHEN (NEW.parent_id IS NULL AND NEW.workflow_run_id IS NULL
          AND NEW.cancel_requested_at IS NOT NULL AND OLD.cancel_requested_at IS NULL
          AND NEW.state = 'running')
    EXECUTE FUNCTION chime_workflow_cancelled();

-- For the handler of run `of_run`: the run that ended and made it (a child job's run; `node`
-- NULL), or, for a workflow node's run (or a task of one), the latest run of every other node
-- of its workflow run that has ended, by node name: the nodes it comes after have all ended
-- when it starts.
CREATE OR REPLACE FUNCTION chime_upstream_runs(of_run bigint)
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
     WHERE r.id = of_run
    UNION ALL
    (SELECT DISTINCT ON (n.node) n.node, n.id, n.job_name, n.state, n.output, n.error,
            n.finished_at
       FROM chime_runs r
       JOIN chime_runs f ON f.id = coalesce(r.parent_id, r.id)
       JOIN chime_runs n ON n.workflow_run_id = f.workflow_run_id AND n.node <> f.node
      WHERE r.id = of_run AND f.workflow_run_id IS NOT NULL AND chime_run_ended(n.state)
      ORDER BY n.node, n.node_round DESC);
END
$$;

-- Alerts of workflow runs: one that failed, and one its timeout stopped (docs/failures.md).
ALTER TABLE chime_alerts DROP CONSTRAINT chime_alerts_kind_check;
ALTER TABLE chime_alerts ADD CONSTRAINT chime_alerts_kind_check
    CHECK (kind IN ('dead', 'timeout', 'worker_lost', 'consecutive_failures', 'workflow_failed',
                    'workflow_timeout')) NOT VALID;
ALTER TABLE chime_alerts VALIDATE CONSTRAINT chime_alerts_kind_check;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION chime_upstream_runs(bigint) SECURITY DEFINER '
                   'SET search_path = %I, pg_temp', current_schema());
    REVOKE EXECUTE ON FUNCTION chime_workflow_cancelled() FROM PUBLIC;
    REVOKE EXECUTE ON FUNCTION chime_upstream_runs(bigint) FROM PUBLIC;
END
$$;
