-- One home for each rule of the protocol: the leader's fence, worker liveness, a run's retry
-- policy snapshot and the retry-or-dead decision, and every write a worker makes (claim,
-- heartbeat, log lines, outcome, take-over, dead runs, the registry), each as one function here.
-- The scheduler (Rust) and the workers (any language) call these; docs/protocol.md states their
-- contracts and a test keeps that page and this schema naming the same `chime_*` functions.
-- The COMMENT of a function a worker calls starts with "Protocol:"; of one only the
-- scheduler calls, with "Scheduler:".
--
-- Plans. The batch functions (claim, outcome) are plpgsql with `SET plan_cache_mode =
-- force_custom_plan`: each call plans its statement for the arrays it got, as the unnamed
-- statements they replace were (a generic plan guesses ten rows per array and joins the CTEs
-- in nested loops, quadratic in the batch: docs/benchmarks.md), and each still finds every row
-- by its primary key on a database without statistics (`LATERAL … FOR UPDATE`, `= ANY
-- (ARRAY[…])`), which a test checks through `pg_stat_xact_user_tables` (no sequential scan).
-- The small predicates (liveness, max attempts) are LANGUAGE sql and not volatile, so the
-- planner inlines them: plans stay as with the expression written out.

-- ---- the fence ---------------------------------------------------------------------------

-- The lease row of `(holder, term)` while it is unexpired, locked FOR KEY SHARE: a fenced
-- statement joins its writes to this (`WITH lease AS (SELECT term FROM chime_fence($1, $2))`,
-- writes only `WHERE EXISTS (SELECT FROM lease)`). The lock is a row lock of the calling
-- transaction, held to its end as when the SELECT was written inline: a takeover (which changes
-- the key `(name, term)`) waits for every fenced write in flight; a renewal (which changes only
-- `expires_at`) never does. VOLATILE (FOR KEY SHARE is refused in a non-volatile function), so
-- it is not inlined; ROWS 1 keeps the planner's estimate of the lease at one row.
CREATE FUNCTION chime_fence(fence_holder text, fence_term bigint)
RETURNS TABLE (term bigint)
LANGUAGE sql VOLATILE ROWS 1
AS $$
    SELECT l.term FROM chime_leader l
     WHERE l.name = 'default' AND l.holder = fence_holder AND l.term = fence_term
       AND l.expires_at > now()
       FOR KEY SHARE
$$;
COMMENT ON FUNCTION chime_fence(text, bigint) IS
'Scheduler: the lease row of (holder, term) if that lease is unexpired, locked FOR KEY SHARE for the rest of the transaction; no row: the fence does not hold and a fenced statement writes nothing.';

-- ---- worker liveness ---------------------------------------------------------------------

-- The instant a worker's heartbeat goes stale: three of its own heartbeat intervals after the
-- last beat (migration 3). The one place that says "three".
CREATE FUNCTION chime_worker_beat_deadline(heartbeat_at timestamptz, heartbeat_interval_ms integer)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT heartbeat_at + 3 * (heartbeat_interval_ms * interval '1 millisecond') $$;
COMMENT ON FUNCTION chime_worker_beat_deadline(timestamptz, integer) IS
'Protocol: when a worker''s heartbeat goes stale, three of its heartbeat intervals after its last beat.';

-- Online: not stopped, and its heartbeat not stale (database clock). Lost is NOT online (or
-- no worker row at all).
CREATE FUNCTION chime_worker_online(stopped_at timestamptz, heartbeat_at timestamptz,
                                    heartbeat_interval_ms integer)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT stopped_at IS NULL
             AND chime_worker_beat_deadline(heartbeat_at, heartbeat_interval_ms) >= now() $$;
COMMENT ON FUNCTION chime_worker_online(timestamptz, timestamptz, integer) IS
'Protocol: a worker row is online while stopped_at is null and its heartbeat is not stale (chime_worker_beat_deadline >= now()); a worker that is not online, or has no row, is lost.';

-- Since when a lost worker has been lost: when it stopped, or its heartbeat went stale,
-- whichever came first. For the rescuer's "lost for longer than rescue_after".
CREATE FUNCTION chime_worker_lost_since(stopped_at timestamptz, heartbeat_at timestamptz,
                                        heartbeat_interval_ms integer)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT least(coalesce(stopped_at, 'infinity'::timestamptz),
                   chime_worker_beat_deadline(heartbeat_at, heartbeat_interval_ms)) $$;
COMMENT ON FUNCTION chime_worker_lost_since(timestamptz, timestamptz, integer) IS
'Scheduler: the instant a worker stopped or its heartbeat went stale, whichever is earlier.';

-- ---- the retry policy snapshot and retry-or-dead -----------------------------------------

-- Every run carries the retry policy its job had when the run was inserted (the job file's
-- form, `chime_jobs.spec->'retry'`, '{}' for a job without one: every field its default), so
-- a later change of the job never changes what happens to a run already made; the outbox
-- publishes it as the trigger's `retry`, and the rescuer and the take-over decide
-- retry-or-dead from it. NULL: no job of that name when the run was inserted, or a finished
-- run from before this migration; read as the default policy.
ALTER TABLE chime_runs ADD COLUMN retry_policy jsonb;

-- What a run snapshots of its job's stored definition: the retry policy, '{}' when the job
-- has none (every field its default).
CREATE FUNCTION chime_retry_snapshot(spec jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT coalesce(spec->'retry', '{}'::jsonb) $$;
COMMENT ON FUNCTION chime_retry_snapshot(jsonb) IS
'Scheduler: the retry policy a new run keeps from its job''s stored definition (spec->''retry'', or ''{}'').';

-- Whoever inserts a run without a snapshot (a manual trigger, a replay, another client), the
-- database takes it from the job. The planner's batch insert passes it itself, joined to the
-- jobs (a trigger call per row costs about 5 µs: 55 ms more for 10,000 fires), and the WHEN
-- clause skips the call for those rows.
CREATE FUNCTION chime_run_retry_snapshot() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.retry_policy := (SELECT chime_retry_snapshot(j.spec)
                           FROM chime_jobs j WHERE j.name = NEW.job_name);
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION chime_run_retry_snapshot() IS
'Scheduler: fills a new run''s retry_policy from its job (chime_retry_snapshot) when the insert gave none.';

CREATE TRIGGER chime_runs_retry_snapshot
    BEFORE INSERT ON chime_runs
    FOR EACH ROW WHEN (NEW.retry_policy IS NULL)
    EXECUTE FUNCTION chime_run_retry_snapshot();

-- Runs that can still be decided (unfinished, or replayable) get their job's policy now: what
-- the rescuer read before this migration. Finished runs keep NULL (the default policy).
UPDATE chime_runs r
   SET retry_policy = chime_retry_snapshot(j.spec)
  FROM chime_jobs j
 WHERE j.name = r.job_name
   AND r.state IN ('pending', 'queued', 'running', 'retrying', 'dead', 'failed', 'cancelled');

-- Attempts in all under a retry policy (the job file's form): `max_attempts` truncated and
-- clamped to 1 ..= 2147483647 for any JSON number (a definition stored before the bounds of
-- docs/configuration.md were checked may say 3000000000); anything else, or no policy, the
-- default 3 (`chime_protocol::retry::DEFAULT_MAX_ATTEMPTS`; a test checks the two agree).
-- Never raises, so one run's policy can never stop a statement for the others.
CREATE FUNCTION chime_retry_max_attempts(policy jsonb) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN jsonb_typeof(policy->'max_attempts') = 'number'
                THEN least(greatest(trunc((policy->>'max_attempts')::numeric), 1),
                           2147483647)::int
                ELSE 3 END
$$;
COMMENT ON FUNCTION chime_retry_max_attempts(jsonb) IS
'Protocol: attempts in all under a run''s retry_policy snapshot (max_attempts clamped to 1..2147483647; default 3).';

-- Retry-or-dead: after attempt `attempt` ended without success (failed, timed out, lost), is
-- the run dead? Yes once `attempt` reached the policy's attempts in all.
CREATE FUNCTION chime_retry_exhausted(policy jsonb, attempt integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT attempt >= chime_retry_max_attempts(policy) $$;
COMMENT ON FUNCTION chime_retry_exhausted(jsonb, integer) IS
'Protocol: true when attempt `attempt` was the last one the retry policy snapshot allows (the run is dead instead of retried).';

-- ---- the worker's calls ------------------------------------------------------------------

-- A run as a worker sees it, with its holder's liveness: what a refused claim is explained
-- by. STABLE, so within a statement it reads the statement's snapshot: called beside
-- chime_claim in one statement, it shows the run as it was before the claim.
CREATE FUNCTION chime_run_snapshot(run_id bigint)
RETURNS TABLE (job_name text, group_name text, state text, attempt integer, worker_id text,
               reason text, error text, next_attempt_at timestamptz, cancel_requested boolean,
               heartbeat_interval_ms integer, holder_restarted boolean, worker_lost boolean)
LANGUAGE sql STABLE
AS $$
    SELECT r.job_name, r.group_name, r.state, r.attempt, r.worker_id, r.reason, r.error,
           r.next_attempt_at, r.cancel_requested_at IS NOT NULL,
           w.heartbeat_interval_ms,
           coalesce(r.started_at < w.started_at, false),
           w.id IS NULL OR NOT chime_worker_online(w.stopped_at, w.heartbeat_at,
                                                   w.heartbeat_interval_ms)
      FROM chime_runs r
      LEFT JOIN chime_workers w ON w.id = r.worker_id
     WHERE r.id = chime_run_snapshot.run_id
$$;
COMMENT ON FUNCTION chime_run_snapshot(bigint) IS
'Protocol: the run (no row: no such run) with its worker''s heartbeat interval, whether that worker registered again after the run started (holder_restarted) and whether it is lost (worker_lost: not online, or not registered).';

-- The claim of a batch of deliveries (one delivery: a batch of one). Per input row: the run
-- moves to `running` for that attempt on `claim_worker` and its attempt row is inserted, only
-- if the run is of that job and of `claim_group`, waiting (pending, queued, retrying), nobody
-- asked to cancel it, and the attempt is the one after the run's last. `started_at` is
-- greatest(now(), the row's start instant) (NULL: now()); `published_at` is kept, or now() for
-- a claim that beat the leader's mark. Rows are locked in id order, as the leader's mark of
-- published runs and every other batch lock them, so two batches never deadlock. Returns the
-- runs claimed, each with its started_at and the database clock at the statement's start.
CREATE FUNCTION chime_claim(run_ids bigint[], attempts integer[], jobs text[],
                            starts_at timestamptz[], claim_worker text, claim_group text)
RETURNS TABLE (run_id bigint, started_at timestamptz, claim_clock timestamptz)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH input AS MATERIALIZED (
        SELECT * FROM unnest(run_ids, attempts, jobs, starts_at) AS i(id, attempt, job, starts)
    ), found AS MATERIALIZED (
        SELECT i.* FROM (SELECT * FROM input ORDER BY id) i
         CROSS JOIN LATERAL (
             SELECT FROM chime_runs r
              WHERE r.id = i.id AND r.job_name = i.job AND r.group_name = claim_group
                AND r.state IN ('pending', 'queued', 'retrying')
                AND r.cancel_requested_at IS NULL
                AND r.attempt = i.attempt - 1
                FOR UPDATE
         ) r
    ), claimed AS (
        UPDATE chime_runs r
           SET state = 'running', attempt = f.attempt, worker_id = claim_worker,
               started_at = greatest(now(), f.starts),
               finished_at = NULL, error = NULL, reason = NULL, next_attempt_at = NULL,
               published_at = coalesce(r.published_at, now())
          FROM found f
         WHERE r.id = ANY (ARRAY[f.id])
        RETURNING r.id, r.attempt, r.started_at
    ), attempt_rows AS (
        INSERT INTO chime_attempts (run_id, attempt, worker_id, state, started_at)
        SELECT c.id, c.attempt, claim_worker, 'running', c.started_at FROM claimed c
    )
    SELECT c.id, c.started_at, statement_timestamp() FROM claimed c;
END
$$;
COMMENT ON FUNCTION chime_claim(bigint[], integer[], text[], timestamptz[], text, text) IS
'Protocol: claims attempt attempts[i] of run run_ids[i] (job jobs[i], starting not before starts_at[i]) for claim_worker of claim_group, if the run is that job''s and group''s, pending/queued/retrying, not cancel-requested and at attempt attempts[i] - 1; inserts the running attempt row. Returns the runs claimed with started_at and the statement''s clock. One claim is a batch of one.';

-- The outcomes of a batch of finished attempts (one outcome: a batch of one), in one
-- statement. Per input row: the attempt row, only while it is `running` on `record_worker`,
-- gets its state, duration, error, started_at (the handler's start, or NULL to keep the
-- claim's estimate) and finished_at = started_at + duration; the run row, only while it is
-- `running` this attempt on `record_worker` (and the attempt row was written), gets the run
-- state (`cancelled` instead of `retrying` or `dead` when a cancel was requested), the error,
-- the dead reason, next_attempt_at (retrying only) and the attempt's times; log lines (flat
-- arrays, in order) are stored only for attempts written. Rows are locked in run id order,
-- each run before its attempt. Returns per input run whether its attempt row was written and
-- the run's new state (NULL: the run had moved on).
CREATE FUNCTION chime_record_outcomes(
    run_ids bigint[], attempts integer[], attempt_states text[], durations_ms bigint[],
    errors text[], run_states text[], reasons text[], next_attempts_at timestamptz[],
    handler_starts timestamptz[], record_worker text,
    log_run_ids bigint[], log_attempts integer[], log_at timestamptz[], log_levels text[],
    log_messages text[])
RETURNS TABLE (run_id bigint, attempt_recorded boolean, run_state text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH input AS MATERIALIZED (
        SELECT * FROM unnest(run_ids, attempts, attempt_states, durations_ms, errors,
                             run_states, reasons, next_attempts_at, handler_starts)
            AS i(id, attempt, attempt_state, duration_ms, error, run_state, reason, next_at,
                 started)
    ), found AS MATERIALIZED (
        SELECT i.*, r.run_ours, r.cancel_requested, a.ours IS NOT NULL AS attempt_ours
          FROM (SELECT * FROM input ORDER BY id) i
         CROSS JOIN LATERAL (
             SELECT r.attempt = i.attempt AND r.worker_id = record_worker
                    AND r.state = 'running' AS run_ours,
                    r.cancel_requested_at IS NOT NULL AS cancel_requested
               FROM chime_runs r WHERE r.id = i.id FOR UPDATE
         ) r
          LEFT JOIN LATERAL (
             SELECT true AS ours FROM chime_attempts a
              WHERE a.run_id = i.id AND a.attempt = i.attempt
                AND a.worker_id = record_worker AND a.state = 'running'
                FOR UPDATE
         ) a ON true
    ), attempts_done AS (
        UPDATE chime_attempts a
           SET state = f.attempt_state, duration_ms = f.duration_ms, error = f.error,
               started_at = coalesce(f.started, a.started_at),
               finished_at = coalesce(f.started, a.started_at)
                             + f.duration_ms::float8 * interval '1 millisecond'
          FROM found f
         WHERE a.run_id = ANY (ARRAY[f.id]) AND a.attempt = ANY (ARRAY[f.attempt])
           AND f.attempt_ours
        RETURNING a.run_id AS id, a.started_at, a.finished_at
    ), runs_done AS (
        UPDATE chime_runs r
           SET state = CASE WHEN f.run_state IN ('retrying', 'dead') AND f.cancel_requested
                            THEN 'cancelled' ELSE f.run_state END,
               started_at = a.started_at,
               finished_at = CASE WHEN f.run_state = 'retrying' AND NOT f.cancel_requested
                                  THEN NULL ELSE a.finished_at END,
               error = f.error,
               reason = CASE WHEN f.run_state = 'dead' AND NOT f.cancel_requested
                             THEN f.reason ELSE r.reason END,
               next_attempt_at = CASE WHEN f.run_state = 'retrying' AND NOT f.cancel_requested
                                      THEN f.next_at END
          FROM found f JOIN attempts_done a ON a.id = f.id
         WHERE r.id = ANY (ARRAY[f.id]) AND f.run_ours
        RETURNING r.id, r.state
    ), logs AS (
        INSERT INTO chime_run_logs (run_id, attempt, at, level, message)
        SELECT l.rid, l.att, l.at, l.lvl, l.msg
          FROM unnest(log_run_ids, log_attempts, log_at, log_levels, log_messages)
                   WITH ORDINALITY AS l(rid, att, at, lvl, msg, n)
          JOIN attempts_done a ON a.id = l.rid
         ORDER BY l.n
    )
    SELECT i.id, a.id IS NOT NULL, r.state
      FROM input i
      LEFT JOIN attempts_done a ON a.id = i.id
      LEFT JOIN runs_done r ON r.id = i.id;
END
$$;
COMMENT ON FUNCTION chime_record_outcomes(bigint[], integer[], text[], bigint[], text[], text[], text[], timestamptz[], timestamptz[], text, bigint[], integer[], timestamptz[], text[], text[]) IS
'Protocol: records finished attempts (attempt row only while running on record_worker; run row only while running that attempt on record_worker; cancelled instead of retrying/dead after a cancel request; log lines only with a written attempt). Returns per run whether the attempt was written and the run''s new state (null: the run moved on). One outcome is a batch of one.';

-- Whether an outcome that found its attempt no longer `running` was written by this very
-- worker with this very outcome (a commit whose reply was lost), and the run's state then.
CREATE FUNCTION chime_outcome_recorded(run_id bigint, attempt integer, record_worker text,
                                       attempt_state text, duration_ms bigint, error text)
RETURNS TABLE (run_recorded boolean, run_state text)
LANGUAGE sql STABLE
AS $$
    SELECT r.attempt = a.attempt AND r.worker_id = a.worker_id AND r.state <> 'running',
           r.state
      FROM chime_attempts a JOIN chime_runs r ON r.id = a.run_id
     WHERE a.run_id = chime_outcome_recorded.run_id
       AND a.attempt = chime_outcome_recorded.attempt
       AND a.worker_id = record_worker AND a.state = attempt_state
       AND a.duration_ms = chime_outcome_recorded.duration_ms
       AND a.error IS NOT DISTINCT FROM chime_outcome_recorded.error
$$;
COMMENT ON FUNCTION chime_outcome_recorded(bigint, integer, text, text, bigint, text) IS
'Protocol: a row if the attempt is recorded by record_worker with exactly this outcome (a retried write whose first commit''s reply was lost); run_recorded says whether the run row was written by it too, run_state is the run''s state.';

-- A batch of log lines of a running attempt, in their order.
CREATE FUNCTION chime_append_logs(run_id bigint, attempt integer, at timestamptz[],
                                  levels text[], messages text[])
RETURNS void
LANGUAGE sql VOLATILE
AS $$
    INSERT INTO chime_run_logs (run_id, attempt, at, level, message)
    SELECT chime_append_logs.run_id, chime_append_logs.attempt, l.at, l.level, l.message
      FROM unnest(chime_append_logs.at, levels, messages)
           WITH ORDINALITY AS l(at, level, message, n)
     ORDER BY l.n
$$;
COMMENT ON FUNCTION chime_append_logs(bigint, integer, timestamptz[], text[], text[]) IS
'Protocol: stores log lines (at, level, message; in array order) of attempt `attempt` of run `run_id`.';

-- Take over a run whose worker was lost, in one transaction: the lost attempt is recorded
-- `lost` (only while it is `running` on `lost_worker`, and, with `require_lost`, only while
-- that worker is not online), then the run (still `running` that attempt on that worker and of
-- job `job`) ends `cancelled` (a cancel was requested), or `dead` (with `dead_reason` when
-- given; when the run has `delivery_limit` lost attempts; or when the lost attempt was the last
-- its retry policy snapshot allows), or its next attempt is claimed for `new_worker`.
-- Returns one row: outcome 'claimed' (with the new attempt and the statement's clock), 'dead'
-- (with the reason), 'cancelled' or 'refused' (nothing written).
CREATE FUNCTION chime_take_over(run_id bigint, job text, lost_attempt integer,
                                lost_worker text, lost_error text, require_lost boolean,
                                delivery_limit integer, dead_reason text, new_worker text)
RETURNS TABLE (outcome text, attempt integer, reason text, claim_clock timestamptz)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_variable
DECLARE
    the_run chime_runs%ROWTYPE;
    lost_count bigint;
BEGIN
    -- A block of its own (a subtransaction): when the run is not where the caller thought,
    -- the attempt's mark is undone and nothing is written, as a rolled-back transaction.
    BEGIN
        UPDATE chime_attempts a
           SET state = 'lost', error = lost_error, finished_at = now(),
               duration_ms = greatest(0, (extract(epoch FROM now() - a.started_at) * 1000)::bigint)
         WHERE a.run_id = chime_take_over.run_id AND a.attempt = lost_attempt
           AND a.worker_id = lost_worker AND a.state = 'running'
           AND (NOT require_lost OR NOT EXISTS (
               SELECT 1 FROM chime_workers w
                WHERE w.id = lost_worker
                  AND chime_worker_online(w.stopped_at, w.heartbeat_at, w.heartbeat_interval_ms)));
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'no_data_found';
        END IF;
        SELECT * INTO the_run FROM chime_runs r
         WHERE r.id = chime_take_over.run_id AND r.job_name = job AND r.state = 'running'
           AND r.attempt = lost_attempt AND r.worker_id = lost_worker
           FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'no_data_found';
        END IF;
    EXCEPTION WHEN no_data_found THEN
        RETURN QUERY SELECT 'refused'::text, NULL::integer, NULL::text, NULL::timestamptz;
        RETURN;
    END;
    IF the_run.cancel_requested_at IS NOT NULL THEN
        UPDATE chime_runs SET state = 'cancelled', finished_at = now(),
                              error = 'cancelled by an operator; ' || lost_error
         WHERE id = the_run.id;
        RETURN QUERY SELECT 'cancelled'::text, NULL::integer, NULL::text, NULL::timestamptz;
        RETURN;
    END IF;
    IF dead_reason IS NULL THEN
        SELECT count(*) INTO lost_count FROM chime_attempts a
         WHERE a.run_id = the_run.id AND a.state = 'lost';
        IF lost_count >= delivery_limit THEN
            dead_reason := format('delivery limit reached: %s attempts were lost with their '
                                  'workers (limit %s), the last on worker %s; a handler that '
                                  'crashes its worker?', lost_count, delivery_limit, lost_worker);
        ELSIF chime_retry_exhausted(the_run.retry_policy, lost_attempt) THEN
            dead_reason := format('worker lost on the last attempt (%s of %s)', lost_attempt,
                                  chime_retry_max_attempts(the_run.retry_policy));
        END IF;
    END IF;
    IF dead_reason IS NOT NULL THEN
        UPDATE chime_runs SET state = 'dead', reason = dead_reason, error = lost_error,
                              finished_at = now(), next_attempt_at = NULL
         WHERE id = the_run.id;
        RETURN QUERY SELECT 'dead'::text, NULL::integer, dead_reason, NULL::timestamptz;
        RETURN;
    END IF;
    WITH claimed AS (
        UPDATE chime_runs
           SET state = 'running', attempt = lost_attempt + 1, worker_id = new_worker,
               started_at = now(), finished_at = NULL, error = NULL, next_attempt_at = NULL
         WHERE id = the_run.id
        RETURNING id, started_at
    )
    INSERT INTO chime_attempts (run_id, attempt, worker_id, state, started_at)
    SELECT c.id, lost_attempt + 1, new_worker, 'running', c.started_at FROM claimed c;
    RETURN QUERY SELECT 'claimed'::text, lost_attempt + 1, NULL::text, statement_timestamp();
END
$$;
COMMENT ON FUNCTION chime_take_over(bigint, text, integer, text, text, boolean, integer, text, text) IS
'Protocol: records attempt lost_attempt of a run lost (if still running on lost_worker and, with require_lost, that worker is not online), then cancels the run (cancel requested), ends it dead (dead_reason, delivery_limit lost attempts, or chime_retry_exhausted on its retry_policy) or claims attempt lost_attempt + 1 for new_worker. Returns outcome claimed/dead/cancelled/refused.';

-- Mark a waiting run dead (a job no worker handles, the last delivery the broker allows), only
-- if it is the run the trigger describes: of `job` and `grp`, waiting for attempt `attempt`.
CREATE FUNCTION chime_mark_dead(run_id bigint, grp text, reason text, by_worker text, job text,
                                attempt integer)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    WITH marked AS (
        UPDATE chime_runs r
           SET state = 'dead', reason = chime_mark_dead.reason, error = chime_mark_dead.reason,
               worker_id = by_worker, finished_at = now()
         WHERE r.id = chime_mark_dead.run_id AND r.group_name = grp
           AND r.state IN ('pending', 'queued', 'retrying')
           AND r.job_name = job AND r.attempt = chime_mark_dead.attempt - 1
        RETURNING 1
    )
    SELECT EXISTS (SELECT FROM marked)
$$;
COMMENT ON FUNCTION chime_mark_dead(bigint, text, text, text, text, integer) IS
'Protocol: ends a waiting run dead with reason (also its error), only if it is of job and grp and waiting for attempt `attempt`; false if there is no such run.';

-- Why a waiting run waits (no online worker has its job's handler); state unchanged, the
-- claim clears it.
CREATE FUNCTION chime_mark_unhandled(run_id bigint, grp text, reason text, job text,
                                     attempt integer)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    WITH marked AS (
        UPDATE chime_runs r SET reason = chime_mark_unhandled.reason
         WHERE r.id = chime_mark_unhandled.run_id AND r.group_name = grp
           AND r.state IN ('pending', 'queued', 'retrying')
           AND r.job_name = job AND r.attempt = chime_mark_unhandled.attempt - 1
           AND r.cancel_requested_at IS NULL
        RETURNING 1
    )
    SELECT EXISTS (SELECT FROM marked)
$$;
COMMENT ON FUNCTION chime_mark_unhandled(bigint, text, text, text, integer) IS
'Protocol: sets a waiting run''s reason (why it waits), only if it is of job and grp, waiting for attempt `attempt`, with no cancel requested; false if there is no such run.';

-- ---- the worker registry -----------------------------------------------------------------

CREATE FUNCTION chime_register_worker(id text, grp text, hostname text, capacity integer,
                                      jobs text[], heartbeat_interval_ms integer)
RETURNS void
LANGUAGE sql VOLATILE
AS $$
    INSERT INTO chime_workers (id, group_name, hostname, capacity, jobs, heartbeat_interval_ms)
    VALUES (id, grp, hostname, capacity, jobs, heartbeat_interval_ms)
    ON CONFLICT (id) DO UPDATE
       SET group_name = EXCLUDED.group_name, hostname = EXCLUDED.hostname,
           capacity = EXCLUDED.capacity, jobs = EXCLUDED.jobs,
           heartbeat_interval_ms = EXCLUDED.heartbeat_interval_ms,
           started_at = now(), heartbeat_at = now(), stopped_at = NULL
$$;
COMMENT ON FUNCTION chime_register_worker(text, text, text, integer, text[], integer) IS
'Protocol: registers (or re-registers, as started now) worker id of group grp with the jobs it handles and its heartbeat interval in ms.';

CREATE FUNCTION chime_heartbeat(worker_id text) RETURNS void
LANGUAGE sql VOLATILE
AS $$ UPDATE chime_workers SET heartbeat_at = now() WHERE id = worker_id $$;
COMMENT ON FUNCTION chime_heartbeat(text) IS
'Protocol: a worker''s heartbeat (database clock); due every heartbeat interval.';

CREATE FUNCTION chime_worker_stopped(worker_id text) RETURNS void
LANGUAGE sql VOLATILE
AS $$ UPDATE chime_workers SET stopped_at = now(), heartbeat_at = now() WHERE id = worker_id $$;
COMMENT ON FUNCTION chime_worker_stopped(text) IS
'Protocol: marks a worker stopped (on exit): it is lost from now on.';

-- Whether a worker of `grp` other than `except_worker` is online and handles `job`.
CREATE FUNCTION chime_handled_elsewhere(grp text, job text, except_worker text) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (
        SELECT 1 FROM chime_workers w
         WHERE w.group_name = grp AND w.id <> except_worker AND job = ANY (w.jobs)
           AND chime_worker_online(w.stopped_at, w.heartbeat_at, w.heartbeat_interval_ms))
$$;
COMMENT ON FUNCTION chime_handled_elsewhere(text, text, text) IS
'Protocol: true if a worker of grp other than except_worker is online and lists job among its handlers.';
