-- Job kinds: a fire of a broadcast, sharded or map/reduce job is a parent run with tasks.
--
-- A task is a run of its own (`parent_id` set): claimed, attempted, retried, timed out, logged,
-- rescued and cancelled by the same calls as any run, so every rule of docs/runs.md holds per
-- task. The parent is never published; the leader expands it when its trigger would go out
-- (`chime_expand_run`), and the database keeps its aggregate: counters and state follow its
-- tasks (`chime_task_changed`, the one home of the aggregate rule). docs/runs.md, "Job kinds".

-- A broadcast task whose worker was lost ends `lost`: broadcast means "on each worker", so it is
-- never moved to another one.
ALTER TABLE chime_runs DROP CONSTRAINT chime_runs_state_check;
ALTER TABLE chime_runs ADD CONSTRAINT chime_runs_state_check
    CHECK (state IN ('pending', 'queued', 'running', 'retrying', 'succeeded', 'failed', 'dead',
                     'cancelled', 'skipped', 'lost'));

ALTER TABLE chime_runs
    ADD COLUMN parent_id     bigint REFERENCES chime_runs (id) ON DELETE CASCADE,
    -- Unique within the parent: `worker/<id>`, `shard/<n>`, `root`, `reduce`, or for a mapped
    -- sub-task `<caller run id>/<step>/<call>/<n>` (a retried caller maps to the same keys).
    ADD COLUMN task_key      text,
    ADD COLUMN task_kind     text CHECK (task_kind IN ('broadcast', 'shard', 'root', 'map', 'reduce')),
    ADD COLUMN shard_index   integer,
    ADD COLUMN shard_total   integer,
    ADD COLUMN shard_param   jsonb,
    -- A broadcast task's worker: its trigger goes to that worker's own queue only.
    ADD COLUMN target_worker text,
    -- A mapped sub-task's step name and nesting depth (the root task is depth 0).
    ADD COLUMN map_step      text,
    ADD COLUMN map_depth     integer,
    -- What the handler returned (JSON, at most limits::MAX_TASK_OUTPUT_BYTES), any run.
    ADD COLUMN output        jsonb,
    -- A parent's tasks: created, ended (any final state) and ended other than `succeeded`.
    ADD COLUMN tasks_total   integer NOT NULL DEFAULT 0,
    ADD COLUMN tasks_ended   integer NOT NULL DEFAULT 0,
    ADD COLUMN tasks_failed  integer NOT NULL DEFAULT 0;

-- One task per key per parent: a duplicate expansion, a map call repeated by a retried caller
-- or a leader failover never makes a task twice.
CREATE UNIQUE INDEX chime_runs_task_key ON chime_runs (parent_id, task_key)
    WHERE parent_id IS NOT NULL;

-- Reading a run's tasks in creation order: `chime runs show`, GET /api/runs/{id}/tasks and the
-- dashboard's task grid page through a parent's tasks by id (keyset), and count them by state;
-- a range scan of this index serves a page (the unique key above finds them, not in id order).
CREATE INDEX chime_runs_task_order ON chime_runs (parent_id, id) WHERE parent_id IS NOT NULL;

-- The fire key is a top-level run's: tasks share their parent's job and instant.
DROP INDEX chime_runs_fire_key;
CREATE UNIQUE INDEX chime_runs_fire_key ON chime_runs (job_name, scheduled_at)
    WHERE trigger <> 'manual' AND parent_id IS NULL;

-- ---- reading a stored definition's kind ---------------------------------------------------

-- The job file's `kind` (docs/configuration.md, "Job kinds"); absent means single.
CREATE FUNCTION chime_job_kind(spec jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT coalesce(spec->>'kind', 'single') $$;
COMMENT ON FUNCTION chime_job_kind(jsonb) IS
'Scheduler: a stored definition''s kind: single (no key), broadcast, sharded or map_reduce.';

-- The final states of a run or task.
CREATE FUNCTION chime_run_ended(state text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT state IN ('succeeded', 'failed', 'dead', 'cancelled', 'skipped', 'lost') $$;
COMMENT ON FUNCTION chime_run_ended(text) IS
'Protocol: whether a run or task state is final (succeeded, failed, dead, cancelled, skipped, lost).';

-- ---- expansion: the leader turns a parent into its tasks ----------------------------------

-- Under the leader's fence: creates the tasks of pending parent `parent` once (its kind, read
-- from the job; broadcast and `shards = "workers"` count the group's workers online now and
-- handling the job), as `queued` without `published_at`, so no outbox sweep publishes them: the
-- caller publishes them and records it (chime_tasks_published); the parent stays `pending`
-- until then, so a leader that dies in between leaves it to the next, whose expansion returns
-- the tasks not yet published. A broadcast below `min_workers` (or a fan-out to no worker)
-- fails the parent with the reason instead. Returns the tasks to publish.
CREATE FUNCTION chime_expand_run(fence_holder text, fence_term bigint, parent bigint)
RETURNS TABLE (id bigint, task_key text, task_kind text, shard_index integer,
               shard_total integer, shard_param jsonb, target_worker text, params jsonb,
               attempt integer, map_step text, map_depth integer)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    lease_term bigint;
    p chime_runs%ROWTYPE;
    spec jsonb;
    kind text;
    workers text[];
    wanted integer;
    n integer;
BEGIN
    SELECT f.term INTO lease_term FROM chime_fence(fence_holder, fence_term) f;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'lock_not_available',
            MESSAGE = format('lease lost (term %s no longer current)', fence_term);
    END IF;
    SELECT * INTO p FROM chime_runs r
     WHERE r.id = parent AND r.parent_id IS NULL AND r.state = 'pending'
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p.tasks_total = 0 THEN
        SELECT j.spec INTO spec FROM chime_jobs j WHERE j.name = p.job_name;
        kind := chime_job_kind(spec);
        IF kind = 'broadcast' OR (kind = 'sharded' AND spec->>'shards' = 'workers') THEN
            workers := ARRAY(
                SELECT w.id FROM chime_workers w
                 WHERE w.group_name = p.group_name AND p.job_name = ANY (w.jobs)
                   AND chime_worker_online(w.stopped_at, w.heartbeat_at, w.heartbeat_interval_ms)
                 ORDER BY w.id);
        END IF;
        wanted := CASE WHEN kind = 'broadcast'
                       THEN CASE WHEN jsonb_typeof(spec->'min_workers') = 'number'
                                 THEN least(greatest((spec->>'min_workers')::numeric, 1),
                                            10000)::integer
                                 ELSE 1 END
                       WHEN kind = 'sharded' AND spec->>'shards' = 'workers' THEN 1 END;
        IF wanted IS NOT NULL AND cardinality(workers) < wanted THEN
            UPDATE chime_runs r
               SET state = 'failed', finished_at = now(),
                   reason = format('%s worker%s of group %s handling job %s online at the fire, '
                                   '%s needed (%s)', cardinality(workers),
                                   CASE WHEN cardinality(workers) = 1 THEN '' ELSE 's' END,
                                   p.group_name, p.job_name, wanted,
                                   CASE WHEN kind = 'broadcast' THEN 'min_workers'
                                        ELSE 'shards = "workers"' END)
             WHERE r.id = p.id;
            RETURN;
        END IF;
        INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state, term,
                                retry_policy, requested_by, parent_id, task_key, task_kind,
                                shard_index, shard_total, shard_param, target_worker, map_depth)
        SELECT p.job_name, p.group_name, p.scheduled_at, p.trigger, p.params,
               -- The reduce task waits in the outbox until the others have ended (Store::outbox).
               CASE WHEN t.task_kind = 'reduce' THEN 'pending' ELSE 'queued' END,
               lease_term, p.retry_policy, p.requested_by, p.id, t.task_key, t.task_kind,
               t.shard_index, t.shard_total, t.shard_param, t.target_worker, t.map_depth
          FROM (
              SELECT 'worker/' || w AS task_key, 'broadcast' AS task_kind,
                     NULL::integer AS shard_index, NULL::integer AS shard_total,
                     NULL::jsonb AS shard_param, w AS target_worker, NULL::integer AS map_depth,
                     o AS ord
                FROM unnest(workers) WITH ORDINALITY AS u(w, o)
               WHERE kind = 'broadcast'
              UNION ALL
              SELECT 'shard/' || i, 'shard', i, s.total,
                     CASE WHEN jsonb_typeof(spec->'shard_params') = 'array'
                          THEN nullif(spec->'shard_params'->i, 'null'::jsonb) END,
                     NULL, NULL, i
                FROM (SELECT CASE WHEN spec->>'shards' = 'workers' THEN cardinality(workers)
                                  WHEN jsonb_typeof(spec->'shards') = 'number'
                                  THEN least((spec->>'shards')::numeric, 10000)::integer
                                  END AS total) s,  -- limits::MAX_SHARDS
                     generate_series(0, s.total - 1) AS i
               WHERE kind = 'sharded'
              UNION ALL
              SELECT k, k, NULL, NULL, NULL, NULL, CASE WHEN k = 'root' THEN 0 END,
                     CASE WHEN k = 'root' THEN 0 ELSE 1 END
                FROM unnest(ARRAY['root', 'reduce']) AS k
               WHERE kind = 'map_reduce'
          ) t
         ORDER BY t.ord
        ON CONFLICT (parent_id, task_key) WHERE parent_id IS NOT NULL DO NOTHING;
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n = 0 THEN
            UPDATE chime_runs r
               SET state = 'failed', finished_at = now(),
                   reason = format('job %s (kind %s) has no task to run', p.job_name, kind)
             WHERE r.id = p.id;
            RETURN;
        END IF;
        UPDATE chime_runs r SET tasks_total = n WHERE r.id = p.id;
    END IF;
    RETURN QUERY
    SELECT t.id, t.task_key, t.task_kind, t.shard_index, t.shard_total, t.shard_param,
           t.target_worker, t.params, t.attempt, t.map_step, t.map_depth
      FROM chime_runs t
     WHERE t.parent_id = p.id AND t.state = 'queued' AND t.published_at IS NULL
       -- A map/reduce run's reduce task waits for every other task (the outbox publishes it).
       AND t.task_kind IS DISTINCT FROM 'reduce'
     ORDER BY t.id;
END
$$;
COMMENT ON FUNCTION chime_expand_run(text, bigint, bigint) IS
'Scheduler: under the fence, creates pending parent run `parent`''s tasks once (by its job''s kind) as queued and unpublished, or fails it when too few workers are online; returns its tasks not yet published.';

-- Under the leader's fence: the broker confirmed these tasks' triggers at `confirmed`.
CREATE FUNCTION chime_tasks_published(fence_holder text, fence_term bigint, ids bigint[],
                                      confirmed timestamptz[])
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    -- A task locked meanwhile is being claimed (or its outcome written): the claim records
    -- published_at itself, so it is skipped rather than waited for.
    WITH lease AS (SELECT term FROM chime_fence(fence_holder, fence_term)), locked AS (
        SELECT r.id, u.at FROM unnest(ids, confirmed) AS u(id, at)
          JOIN chime_runs r ON r.id = u.id
         WHERE r.published_at IS NULL AND EXISTS (SELECT FROM lease)
           FOR UPDATE OF r SKIP LOCKED
    ), upd AS (
        UPDATE chime_runs r SET published_at = l.at FROM locked l WHERE r.id = l.id
    )
    SELECT EXISTS (SELECT FROM lease)
$$;
COMMENT ON FUNCTION chime_tasks_published(text, bigint, bigint[], timestamptz[]) IS
'Scheduler: under the fence, records that the triggers of tasks `ids` were confirmed at `confirmed` (published_at, if not set yet); false when the fence does not hold.';

-- Under the leader's fence: a broadcast task whose worker has no queue (it stopped for good,
-- or its SDK does not take broadcast tasks) ends `lost` with the reason.
CREATE FUNCTION chime_task_unroutable(fence_holder text, fence_term bigint, task bigint,
                                      why text)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    WITH lease AS (SELECT term FROM chime_fence(fence_holder, fence_term)), upd AS (
        UPDATE chime_runs r SET state = 'lost', reason = why, finished_at = now()
         WHERE r.id = task AND r.parent_id IS NOT NULL AND r.state IN ('queued', 'pending')
           AND EXISTS (SELECT FROM lease)
        RETURNING r.id
    )
    SELECT EXISTS (SELECT FROM upd)
$$;
COMMENT ON FUNCTION chime_task_unroutable(text, bigint, bigint, text) IS
'Scheduler: under the fence, ends task `task` lost with reason `why` (its trigger could not be routed to its worker); false when it was not waiting or the fence does not hold.';

-- ---- the aggregate: one home ---------------------------------------------------------------

-- After a statement changed the state of tasks: their parents' counters, and each parent's
-- state, once per parent per statement (a batch of 512 outcomes of one run's tasks writes its
-- parent once, not 512 times: a row-level trigger made each batch walk a growing chain of row
-- versions of the one parent, and held the parent's lock the while). The parent starts running
-- with its first task; when every task has ended it ends: `cancelled` if a cancel was asked,
-- else `succeeded` when no task failed (or `on_task_failure = "ignore"`, the reason then counts
-- the failures), else `dead` when a task is dead, else `failed`. For a map/reduce run the
-- reduce task decides: the run fails when it did, and it waits for every other task (the
-- outbox publishes it when they have ended: woken here). Parents are written in id order, so
-- two statements ending tasks of the same parents lock them in the same order; a parent's
-- UPDATE locks its row, so concurrent statements count one after another.
CREATE FUNCTION chime_task_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    m record;
    p chime_runs%ROWTYPE;
    spec jsonb;
    dead_tasks bigint;
    reduce_state text;
BEGIN
    -- Most statements change no task (runs of single jobs): one scan of the changed rows says
    -- so, and nothing is planned for them.
    IF NOT EXISTS (SELECT 1 FROM chime_new_runs n WHERE n.parent_id IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    -- EXECUTE plans the sums anew for each statement: a plan cached by the function would be
    -- one made for the sizes of the transition tables it first saw (a join fit for one row,
    -- seconds for a batch of 10,000).
    FOR m IN EXECUTE
        $q$SELECT n.parent_id AS id,
                  sum(chime_run_ended(n.state)::integer
                      - chime_run_ended(o.state)::integer) AS ended,
                  sum((chime_run_ended(n.state) AND n.state <> 'succeeded')::integer
                      - (chime_run_ended(o.state) AND o.state <> 'succeeded')::integer)
                      AS failed,
                  bool_or(n.state = 'running') AS started,
                  min(n.started_at) FILTER (WHERE n.state = 'running') AS first_start
             FROM chime_new_runs n JOIN chime_old_runs o ON o.id = n.id
            WHERE n.parent_id IS NOT NULL AND n.state IS DISTINCT FROM o.state
            GROUP BY n.parent_id
            ORDER BY n.parent_id$q$
    LOOP
        IF m.ended = 0 AND m.failed = 0 THEN
            -- No count changes (claims, retries): the parent only starts running with its
            -- first task; its row is not written again, so claims do not queue on it.
            IF m.started THEN
                UPDATE chime_runs r SET state = 'running', started_at = m.first_start
                 WHERE r.id = m.id AND r.state IN ('pending', 'queued');
            END IF;
            CONTINUE;
        END IF;
        UPDATE chime_runs r
           SET tasks_ended = r.tasks_ended + m.ended,
               tasks_failed = r.tasks_failed + m.failed,
               state = CASE WHEN m.started AND r.state IN ('pending', 'queued')
                            THEN 'running' ELSE r.state END,
               started_at = CASE WHEN m.started AND r.started_at IS NULL
                                 THEN m.first_start ELSE r.started_at END
         WHERE r.id = m.id
        RETURNING * INTO p;
        IF NOT FOUND OR chime_run_ended(p.state) THEN
            CONTINUE;
        END IF;
        IF p.tasks_ended = p.tasks_total - 1 AND m.ended > 0 THEN
            -- One task left: when it is a map/reduce run's reduce task, wake the outbox for it.
            IF EXISTS (SELECT 1 FROM chime_runs t WHERE t.parent_id = p.id
                          AND t.task_key = 'reduce' AND t.state = 'pending') THEN
                PERFORM pg_notify('chime_outbox', 'reduce ' || p.id);
            END IF;
            CONTINUE;
        END IF;
        IF p.tasks_ended < p.tasks_total THEN
            CONTINUE;
        END IF;
        SELECT j.spec INTO spec FROM chime_jobs j WHERE j.name = p.job_name;
        SELECT t.state INTO reduce_state FROM chime_runs t
         WHERE t.parent_id = p.id AND t.task_kind = 'reduce';
        SELECT count(*) INTO dead_tasks FROM chime_runs t
         WHERE t.parent_id = p.id AND t.state = 'dead';
        UPDATE chime_runs r
           SET finished_at = now(),
               state = CASE
                   WHEN p.cancel_requested_at IS NOT NULL THEN 'cancelled'
                   WHEN reduce_state IS NOT NULL AND reduce_state <> 'succeeded'
                       THEN CASE WHEN reduce_state = 'dead' THEN 'dead' ELSE 'failed' END
                   WHEN p.tasks_failed = 0 OR spec->>'on_task_failure' = 'ignore'
                       THEN 'succeeded'
                   WHEN dead_tasks > 0 THEN 'dead'
                   ELSE 'failed' END,
               reason = CASE
                   WHEN p.cancel_requested_at IS NOT NULL
                       THEN 'cancelled by ' || coalesce(p.cancel_requested_by, '?')
                   WHEN p.tasks_failed = 0 THEN NULL
                   WHEN reduce_state IS NOT NULL AND reduce_state <> 'succeeded'
                       THEN format('the reduce task ended %s', reduce_state)
                   ELSE format('%s of %s tasks did not succeed%s', p.tasks_failed,
                               p.tasks_total,
                               CASE WHEN spec->>'on_task_failure' = 'ignore'
                                    THEN ' (on_task_failure = "ignore")' ELSE '' END) END
         WHERE r.id = p.id;
    END LOOP;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION chime_task_changed() IS
'Scheduler: keeps parent runs'' task counters and aggregate state as a statement changes the state of their tasks (statement trigger chime_runs_task_changed, once per parent per statement).';

-- A statement trigger with transition tables (PostgreSQL allows no column list with them, so
-- it sees every UPDATE of chime_runs; one without tasks costs a scan of its changed rows).
CREATE TRIGGER chime_runs_task_changed
    AFTER UPDATE ON chime_runs
    REFERENCING OLD TABLE AS chime_old_runs NEW TABLE AS chime_new_runs
    FOR EACH STATEMENT
    EXECUTE FUNCTION chime_task_changed();

-- A cancel of a parent is a cancel of each of its unfinished tasks: those not started end
-- `cancelled` at once, running ones get the request (the operator's cancel sends one control
-- message naming the parent; a worker cancels its tasks of that run). The parent then ends
-- `cancelled` when its last task has.
CREATE FUNCTION chime_parent_cancelled() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE chime_runs t
       SET cancel_requested_at = coalesce(NEW.cancel_requested_at, now()),
           cancel_requested_by = coalesce(NEW.cancel_requested_by, 'cancel of run ' || NEW.id),
           state = CASE WHEN t.state IN ('pending', 'queued', 'retrying') THEN 'cancelled'
                        ELSE t.state END,
           finished_at = CASE WHEN t.state IN ('pending', 'queued', 'retrying') THEN now()
                              ELSE t.finished_at END,
           next_attempt_at = CASE WHEN t.state = 'retrying' THEN NULL ELSE t.next_attempt_at END
     WHERE t.parent_id = NEW.id AND NOT chime_run_ended(t.state)
       AND t.cancel_requested_at IS NULL;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION chime_parent_cancelled() IS
'Scheduler: passes a cancel of a parent run on to its unfinished tasks (trigger chime_runs_parent_cancelled).';

CREATE TRIGGER chime_runs_parent_cancelled
    AFTER UPDATE OF cancel_requested_at, state ON chime_runs
    FOR EACH ROW
    WHEN (NEW.parent_id IS NULL AND NEW.tasks_total > 0
          AND ((NEW.cancel_requested_at IS NOT NULL AND OLD.cancel_requested_at IS NULL)
               OR (NEW.state = 'cancelled' AND OLD.state <> 'cancelled')))
    EXECUTE FUNCTION chime_parent_cancelled();

-- ---- operators: rerun the failed tasks of a finished run ------------------------------------

-- Puts the tasks of finished parent `parent` that did not succeed back in the outbox (the same
-- run: each task's next attempt, with its retry budget renewed), and for a map/reduce run its
-- reduce task too when another task reruns; the parent is running again. Returns how many
-- tasks rerun; raises 22023 naming the run when it has no tasks or has not finished.
CREATE FUNCTION chime_retry_failed(parent bigint, by_actor text) RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_variable
DECLARE
    p chime_runs%ROWTYPE;
    n integer;
BEGIN
    SELECT * INTO p FROM chime_runs r WHERE r.id = parent FOR UPDATE;
    IF NOT FOUND OR p.parent_id IS NOT NULL OR p.tasks_total = 0 THEN
        PERFORM chime_invalid('run', parent::text,
                              'not a run with tasks (a broadcast, sharded or map/reduce fire)',
                              'give the id of such a run, as `chime runs list` shows it');
    END IF;
    IF NOT chime_run_ended(p.state) THEN
        PERFORM chime_invalid('run', parent::text,
                              format('run %s is %s; only a finished run''s failed tasks rerun',
                                     parent, p.state),
                              'wait for it to finish, or cancel it first');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM chime_runs t
                    WHERE t.parent_id = parent AND t.state NOT IN ('succeeded', 'skipped')
                      AND chime_run_ended(t.state)) THEN
        PERFORM chime_invalid('run', parent::text,
                              format('run %s has no failed task to rerun', parent),
                              'trigger the job again to run it all anew');
    END IF;
    UPDATE chime_runs r
       SET state = 'queued', finished_at = NULL, started_at = NULL,
           reason = format('rerun of its failed tasks by %s', by_actor),
           cancel_requested_at = NULL, cancel_requested_by = NULL, error = NULL
     WHERE r.id = parent;
    WITH rerun AS (
        SELECT t.id FROM chime_runs t
         WHERE t.parent_id = parent AND t.state NOT IN ('succeeded', 'skipped')
           AND chime_run_ended(t.state)
    ), with_reduce AS (
        SELECT id FROM rerun
        UNION
        SELECT t.id FROM chime_runs t
         WHERE t.parent_id = parent AND t.task_kind = 'reduce' AND chime_run_ended(t.state)
           AND EXISTS (SELECT 1 FROM rerun x JOIN chime_runs o ON o.id = x.id
                        WHERE o.task_kind IS DISTINCT FROM 'reduce')
    )
    UPDATE chime_runs t
       SET state = 'pending', finished_at = NULL, published_at = NULL, error = NULL,
           reason = format('rerun by %s', by_actor), next_attempt_at = NULL,
           cancel_requested_at = NULL, cancel_requested_by = NULL,
           retry_policy = jsonb_set(coalesce(t.retry_policy, '{}'::jsonb), '{max_attempts}',
               to_jsonb(least(t.attempt::bigint + chime_retry_max_attempts(t.retry_policy),
                              2147483647)))
      FROM with_reduce w
     WHERE t.id = w.id;
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM pg_notify('chime_outbox', 'retry-failed ' || parent);
    RETURN n;
END
$$;
COMMENT ON FUNCTION chime_retry_failed(bigint, text) IS
'Scheduler: reruns the tasks of finished run `parent` that did not succeed (and its reduce task), in the same run; returns how many; 22023 when it has no tasks or has not finished.';

-- ---- the worker's calls for map/reduce -----------------------------------------------------

-- Attempt `attempt` of task `caller` (running on `map_worker`) maps `items` to sub-tasks of its
-- run, one per item (the item is the sub-task's params), under step name `step`; `call_no` counts
-- the caller's map calls within the attempt, so a retried caller that maps again makes the same
-- keys and no duplicate. Persisted `pending` and published by the leader's outbox (woken here):
-- a worker that dies right after the call loses none. Returns the sub-tasks created (0 when all
-- existed). Raises 22023 naming the field for a bad step, too many items, too deep or too many
-- tasks, and when the caller is not a running root or map task of this worker.
CREATE FUNCTION chime_map(caller bigint, attempt integer, map_worker text, step text,
                          call_no integer, items jsonb[])
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_variable
DECLARE
    max_items constant integer := 10000;     -- limits::MAX_MAP_ITEMS_PER_CALL
    max_tasks constant integer := 100000;    -- limits::MAX_TASKS_PER_RUN
    max_item_bytes constant integer := 65536; -- limits::MAX_PARAMS_BYTES
    c chime_runs%ROWTYPE;
    depth_limit integer;
    n integer;
BEGIN
    PERFORM chime_require_runs(ARRAY[caller]);
    SELECT * INTO c FROM chime_runs r WHERE r.id = caller;
    IF NOT FOUND OR c.parent_id IS NULL OR c.task_kind NOT IN ('root', 'map')
       OR c.state <> 'running' OR c.attempt <> chime_map.attempt
       OR c.worker_id IS DISTINCT FROM map_worker THEN
        PERFORM chime_invalid('run', caller::text,
                              'only a running root or mapped task of a map_reduce job maps, on '
                              'the worker running it',
                              'call map from the handler of such a task while it runs');
    END IF;
    IF step IS NULL OR step !~ '^[A-Za-z0-9_.-]{1,64}$' THEN
        PERFORM chime_invalid('step', coalesce(step, 'null'), 'not a step name',
                              'use 1 to 64 characters of A-Z, a-z, 0-9, _ . -');
    END IF;
    IF cardinality(items) > max_items THEN
        PERFORM chime_invalid('items', cardinality(items)::text,
                              format('more than %s items in one map call', max_items),
                              'map in several calls');
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(items) AS i WHERE octet_length(i::text) > max_item_bytes) THEN
        PERFORM chime_invalid('items', step,
                              format('an item is larger than %s bytes of JSON', max_item_bytes),
                              'map references (ids, keys), not the data');
    END IF;
    SELECT coalesce((j.spec->>'map_depth')::integer, 3) INTO depth_limit
      FROM chime_jobs j WHERE j.name = c.job_name;
    IF coalesce(c.map_depth, 0) + 1 > coalesce(depth_limit, 3) THEN
        PERFORM chime_invalid('map_depth', (coalesce(c.map_depth, 0) + 1)::text,
                              format('sub-tasks nest deeper than the job''s map_depth %s',
                                     coalesce(depth_limit, 3)),
                              'raise map_depth in the job file, or map fewer levels');
    END IF;
    -- The parent's row lock orders concurrent map calls of one run, so the cap holds.
    PERFORM 1 FROM chime_runs r WHERE r.id = c.parent_id FOR UPDATE;
    IF (SELECT r.tasks_total FROM chime_runs r WHERE r.id = c.parent_id)
       + cardinality(items) > max_tasks THEN
        PERFORM chime_invalid('items', cardinality(items)::text,
                              format('run %s would have more than %s tasks', c.parent_id,
                                     max_tasks),
                              'map coarser items');
    END IF;
    INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state, term,
                            retry_policy, requested_by, parent_id, task_key, task_kind,
                            map_step, map_depth)
    SELECT c.job_name, c.group_name, c.scheduled_at, c.trigger, coalesce(i.item, 'null'),
           'pending', c.term, c.retry_policy, c.requested_by, c.parent_id,
           format('%s/%s/%s/%s', caller, step, call_no, i.n - 1), 'map', step,
           coalesce(c.map_depth, 0) + 1
      FROM unnest(items) WITH ORDINALITY AS i(item, n)
     ORDER BY i.n
    ON CONFLICT (parent_id, task_key) WHERE parent_id IS NOT NULL DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        UPDATE chime_runs r SET tasks_total = r.tasks_total + n WHERE r.id = c.parent_id;
        PERFORM pg_notify('chime_outbox', 'map ' || c.parent_id);
    END IF;
    RETURN n;
END
$$;
COMMENT ON FUNCTION chime_map(bigint, integer, text, text, integer, jsonb[]) IS
'Protocol: running task `caller` (attempt, worker) maps `items` to sub-tasks of its run under `step` (`call_no` = the caller''s map call number in this attempt, so a retry makes the same keys); persisted pending, published by the leader; returns how many were new.';

-- Attempt `attempt` of run `run_id` (running on `output_worker`) returns `output` (JSON, at most
-- limits::MAX_TASK_OUTPUT_BYTES): stored with the run, read by a reduce task and the API.
-- Returns false when the attempt is not running there any more (nothing written).
CREATE FUNCTION chime_set_output(run_id bigint, attempt integer, output_worker text,
                                 output jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_variable
DECLARE
    max_bytes constant integer := 65536; -- limits::MAX_TASK_OUTPUT_BYTES
BEGIN
    PERFORM chime_require_runs(ARRAY[run_id]);
    IF octet_length(output::text) > max_bytes THEN
        PERFORM chime_invalid('output', format('%s bytes', octet_length(output::text)),
                              format('a handler''s output is at most %s bytes of JSON',
                                     max_bytes),
                              'return a summary or a reference (a key, a URL), not the data');
    END IF;
    UPDATE chime_runs r SET output = chime_set_output.output
     WHERE r.id = run_id AND r.state = 'running' AND r.attempt = chime_set_output.attempt
       AND r.worker_id = output_worker;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION chime_set_output(bigint, integer, text, jsonb) IS
'Protocol: the running attempt of run_id on output_worker stores its handler''s output (JSON, 64 KiB at most, else 22023); false when that attempt is not running there.';

-- For the reduce task `reduce_run`: the other tasks of its run, in creation order after task id
-- `after_id` (keyset paging; 0 for the first page), at most `page` (1 ..= 1000) of them.
CREATE FUNCTION chime_task_results(reduce_run bigint, after_id bigint, page integer)
RETURNS TABLE (id bigint, task_key text, task_kind text, map_step text, shard_index integer,
               state text, output jsonb, error text, params jsonb)
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
BEGIN
    PERFORM chime_require_runs(ARRAY[reduce_run]);
    RETURN QUERY
    SELECT t.id, t.task_key, t.task_kind, t.map_step, t.shard_index, t.state, t.output,
           t.error, t.params
      FROM chime_runs r JOIN chime_runs t ON t.parent_id = r.parent_id
     WHERE r.id = reduce_run AND r.parent_id IS NOT NULL AND t.id <> r.id
       AND t.id > after_id
     ORDER BY t.id
     LIMIT least(greatest(page, 1), 1000);
END
$$;
COMMENT ON FUNCTION chime_task_results(bigint, bigint, integer) IS
'Protocol: for a reduce task: the other tasks of its run (key, kind, step, shard, state, output, error, params) by id after `after_id`, at most `page` (≤ 1000).';

-- ---- the worker role gets the new calls --------------------------------------------------

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
    FOREACH f IN ARRAY ARRAY['chime_map(bigint, integer, text, text, integer, jsonb[])',
                             'chime_set_output(bigint, integer, text, jsonb)',
                             'chime_task_results(bigint, bigint, integer)']::regprocedure[] LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp',
                       f, current_schema());
    END LOOP;
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
              WHERE p.pronamespace = current_schema()::regnamespace
                AND p.proname IN ('chime_job_kind', 'chime_run_ended', 'chime_expand_run',
                                  'chime_tasks_published', 'chime_task_unroutable',
                                  'chime_task_changed', 'chime_parent_cancelled',
                                  'chime_retry_failed', 'chime_map', 'chime_set_output',
                                  'chime_task_results') LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
    -- Roles granted before this migration get the new calls as chime_grant_worker would.
    FOR g IN SELECT DISTINCT gr.role FROM chime_worker_grants gr
               JOIN pg_roles r ON r.rolname = gr.role LOOP
        FOR f IN SELECT * FROM chime_worker_functions() LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, g.role);
        END LOOP;
    END LOOP;
END
$$;
