-- Least privilege for workers, the retry-or-dead decision as a call, and triggering a run from
-- code (docs/protocol.md sections 10 and 11).
--
-- A worker connects as a role of its own with no table privileges at all: it may EXECUTE the
-- worker functions (chime_worker_functions()), which run as their owner (SECURITY DEFINER, with
-- a pinned search_path) and refuse, with SQLSTATE 42501, any run, worker or job of an executor
-- group the calling role is not granted (chime_may_act_for). The caller is `session_user`: the
-- role that logged in, which a SECURITY DEFINER function cannot change. The owner (any role
-- that may UPDATE chime_runs itself: the scheduler, an administrator) may act for every group,
-- at the cost of one privilege lookup per call.
--
-- Migrations create no roles (roles are global to the cluster); `chime workers grant` prints or
-- runs what an administrator does: CREATE ROLE, then SELECT chime_grant_worker(role, group, by).

-- ---- grants ------------------------------------------------------------------------------

-- Which role may act for which executor group. A member of a role listed here (pg_has_role
-- MEMBER: the role itself, or a login role granted it) may act for the group.
CREATE TABLE chime_worker_grants (
    role       name        NOT NULL,
    group_name text        NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    granted_by text        NOT NULL,
    PRIMARY KEY (role, group_name)
);
CREATE INDEX chime_worker_grants_group ON chime_worker_grants (group_name);

-- Whether the caller is the owner side: may it write chime_runs directly? Then it may act for
-- every group, and the functions below skip their group checks.
CREATE FUNCTION chime_acts_as_owner() RETURNS boolean
LANGUAGE sql STABLE
AS $$ SELECT has_table_privilege(session_user, 'chime_runs', 'UPDATE') $$;
COMMENT ON FUNCTION chime_acts_as_owner() IS
'Scheduler: true when session_user may UPDATE chime_runs itself (the owner, an administrator): it may act for every executor group.';

CREATE FUNCTION chime_may_act_for(grp text) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT has_table_privilege(session_user, 'chime_runs', 'UPDATE')
        OR EXISTS (SELECT 1 FROM chime_worker_grants g JOIN pg_roles r ON r.rolname = g.role
                    WHERE g.group_name = grp AND pg_has_role(session_user, r.oid, 'MEMBER'))
$$;
COMMENT ON FUNCTION chime_may_act_for(text) IS
'Protocol: true when session_user may act for executor group grp: it may write chime_runs directly (owner, administrator), or it is a member of a role granted grp (chime_grant_worker).';

-- Raises insufficient_privilege (42501) unless the caller may act for `grp`; `what` names the
-- run, worker or job concerned.
CREATE FUNCTION chime_require_group(grp text, what text) RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF NOT chime_may_act_for(grp) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'insufficient_privilege',
            MESSAGE = format('role %s may not act for executor group %s (%s); an administrator '
                             'grants it with `chime workers grant --group %s --role %s`',
                             session_user, grp, what, grp, session_user),
            HINT = format('chime workers grant --group %s --role %s', grp, session_user);
    END IF;
END
$$;
COMMENT ON FUNCTION chime_require_group(text, text) IS
'Scheduler: raises 42501 naming the group, the role and the fix unless chime_may_act_for(grp).';

-- The checks of a batch of runs: one lookup by primary key over the array and one check per
-- distinct group (usually one), none for the owner. A run that does not exist is not refused
-- (the batch's own filters skip it).
CREATE FUNCTION chime_require_runs(run_ids bigint[]) RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    grp text;
BEGIN
    IF chime_acts_as_owner() THEN
        RETURN;
    END IF;
    FOR grp IN SELECT DISTINCT r.group_name FROM chime_runs r WHERE r.id = ANY (run_ids) LOOP
        PERFORM chime_require_group(grp, format('runs %s', array_to_string(
            ARRAY(SELECT r.id FROM chime_runs r WHERE r.id = ANY (run_ids) AND r.group_name = grp
                   ORDER BY r.id LIMIT 5), ', ')));
    END LOOP;
END
$$;
COMMENT ON FUNCTION chime_require_runs(bigint[]) IS
'Scheduler: raises 42501 (chime_require_group) when a run of run_ids is of a group the caller may not act for; nothing for the owner.';

-- The check of a worker row (heartbeat, stop, re-registration): its group.
CREATE FUNCTION chime_require_worker(worker text) RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    grp text;
BEGIN
    IF chime_acts_as_owner() THEN
        RETURN;
    END IF;
    SELECT w.group_name INTO grp FROM chime_workers w WHERE w.id = worker;
    IF FOUND THEN
        PERFORM chime_require_group(grp, format('worker %s', worker));
    END IF;
END
$$;
COMMENT ON FUNCTION chime_require_worker(text) IS
'Scheduler: raises 42501 (chime_require_group) when worker `worker` is of a group the caller may not act for.';

-- ---- the worker's calls, redefined with their group checks -------------------------------
-- Same signatures, results and plans as in migration `protocol_calls`; each adds one check
-- before it acts. SECURITY DEFINER and the search_path are set at the end, for all at once.

CREATE OR REPLACE FUNCTION chime_run_snapshot(run_id bigint)
RETURNS TABLE (job_name text, group_name text, state text, attempt integer, worker_id text,
               reason text, error text, next_attempt_at timestamptz, cancel_requested boolean,
               heartbeat_interval_ms integer, holder_restarted boolean, worker_lost boolean)
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
BEGIN
    PERFORM chime_require_runs(ARRAY[chime_run_snapshot.run_id]);
    RETURN QUERY
    SELECT r.job_name, r.group_name, r.state, r.attempt, r.worker_id, r.reason, r.error,
           r.next_attempt_at, r.cancel_requested_at IS NOT NULL,
           w.heartbeat_interval_ms,
           coalesce(r.started_at < w.started_at, false),
           w.id IS NULL OR NOT chime_worker_online(w.stopped_at, w.heartbeat_at,
                                                   w.heartbeat_interval_ms)
      FROM chime_runs r
      LEFT JOIN chime_workers w ON w.id = r.worker_id
     WHERE r.id = chime_run_snapshot.run_id;
END
$$;

CREATE OR REPLACE FUNCTION chime_claim(run_ids bigint[], attempts integer[], jobs text[],
                                       starts_at timestamptz[], claim_worker text,
                                       claim_group text)
RETURNS TABLE (run_id bigint, started_at timestamptz, claim_clock timestamptz)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
BEGIN
    -- The claim only takes runs of claim_group: one check covers the batch.
    PERFORM chime_require_group(claim_group, format('claim by worker %s', claim_worker));
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

CREATE OR REPLACE FUNCTION chime_record_outcomes(
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
    -- Log lines are stored only with an attempt of run_ids written: checking run_ids covers
    -- them.
    PERFORM chime_require_runs(run_ids);
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

CREATE OR REPLACE FUNCTION chime_outcome_recorded(run_id bigint, attempt integer,
                                                  record_worker text, attempt_state text,
                                                  duration_ms bigint, error text)
RETURNS TABLE (run_recorded boolean, run_state text)
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
BEGIN
    PERFORM chime_require_runs(ARRAY[chime_outcome_recorded.run_id]);
    RETURN QUERY
    SELECT r.attempt = a.attempt AND r.worker_id = a.worker_id AND r.state <> 'running',
           r.state
      FROM chime_attempts a JOIN chime_runs r ON r.id = a.run_id
     WHERE a.run_id = chime_outcome_recorded.run_id
       AND a.attempt = chime_outcome_recorded.attempt
       AND a.worker_id = record_worker AND a.state = attempt_state
       AND a.duration_ms = chime_outcome_recorded.duration_ms
       AND a.error IS NOT DISTINCT FROM chime_outcome_recorded.error;
END
$$;

CREATE OR REPLACE FUNCTION chime_append_logs(run_id bigint, attempt integer, at timestamptz[],
                                             levels text[], messages text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM chime_require_runs(ARRAY[chime_append_logs.run_id]);
    INSERT INTO chime_run_logs (run_id, attempt, at, level, message)
    SELECT chime_append_logs.run_id, chime_append_logs.attempt, l.at, l.level, l.message
      FROM unnest(chime_append_logs.at, levels, messages)
           WITH ORDINALITY AS l(at, level, message, n)
     ORDER BY l.n;
END
$$;

-- chime_take_over: migration 11's body after one check of the run's group.
CREATE OR REPLACE FUNCTION chime_take_over(run_id bigint, job text, lost_attempt integer,
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
    PERFORM chime_require_runs(ARRAY[chime_take_over.run_id]);
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

CREATE OR REPLACE FUNCTION chime_mark_dead(run_id bigint, grp text, reason text, by_worker text,
                                           job text, attempt integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
BEGIN
    PERFORM chime_require_group(grp, format('run %s', chime_mark_dead.run_id));
    PERFORM chime_require_runs(ARRAY[chime_mark_dead.run_id]);
    UPDATE chime_runs r
       SET state = 'dead', reason = chime_mark_dead.reason,
           error = chime_mark_dead.reason, worker_id = by_worker, finished_at = now()
     WHERE r.id = chime_mark_dead.run_id AND r.group_name = grp
       AND r.state IN ('pending', 'queued', 'retrying')
       AND r.job_name = job AND r.attempt = chime_mark_dead.attempt - 1;
    RETURN FOUND;
END
$$;

CREATE OR REPLACE FUNCTION chime_mark_unhandled(run_id bigint, grp text, reason text, job text,
                                                attempt integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
BEGIN
    PERFORM chime_require_group(grp, format('run %s', chime_mark_unhandled.run_id));
    PERFORM chime_require_runs(ARRAY[chime_mark_unhandled.run_id]);
    UPDATE chime_runs r SET reason = chime_mark_unhandled.reason
     WHERE r.id = chime_mark_unhandled.run_id AND r.group_name = grp
       AND r.state IN ('pending', 'queued', 'retrying')
       AND r.job_name = job AND r.attempt = chime_mark_unhandled.attempt - 1
       AND r.cancel_requested_at IS NULL;
    RETURN FOUND;
END
$$;

CREATE OR REPLACE FUNCTION chime_register_worker(id text, grp text, hostname text,
                                                 capacity integer, jobs text[],
                                                 heartbeat_interval_ms integer)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_variable
BEGIN
    PERFORM chime_require_group(grp, format('worker %s', id));
    -- Nor may it take over the id of another group's worker.
    PERFORM chime_require_worker(id);
    INSERT INTO chime_workers AS w (id, group_name, hostname, capacity, jobs,
                                    heartbeat_interval_ms)
    VALUES (id, grp, hostname, capacity, jobs, heartbeat_interval_ms)
    ON CONFLICT ON CONSTRAINT chime_workers_pkey DO UPDATE
       SET group_name = EXCLUDED.group_name, hostname = EXCLUDED.hostname,
           capacity = EXCLUDED.capacity, jobs = EXCLUDED.jobs,
           heartbeat_interval_ms = EXCLUDED.heartbeat_interval_ms,
           started_at = now(), heartbeat_at = now(), stopped_at = NULL;
END
$$;

CREATE OR REPLACE FUNCTION chime_heartbeat(worker_id text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM chime_require_worker(worker_id);
    UPDATE chime_workers SET heartbeat_at = now() WHERE id = worker_id;
END
$$;

CREATE OR REPLACE FUNCTION chime_worker_stopped(worker_id text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM chime_require_worker(worker_id);
    UPDATE chime_workers SET stopped_at = now(), heartbeat_at = now() WHERE id = worker_id;
END
$$;

CREATE OR REPLACE FUNCTION chime_handled_elsewhere(grp text, job text, except_worker text)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    PERFORM chime_require_group(grp, format('the registry of group %s', grp));
    RETURN EXISTS (
        SELECT 1 FROM chime_workers w
         WHERE w.group_name = grp AND w.id <> except_worker AND job = ANY (w.jobs)
           AND chime_worker_online(w.stopped_at, w.heartbeat_at, w.heartbeat_interval_ms));
END
$$;

-- ---- the retry-or-dead decision ----------------------------------------------------------

-- Milliseconds of a duration in the job file's form (humantime: "10s", "1m 30s", "250ms",
-- "1day"), or NULL when it does not parse. Units as humantime reads them (a month 30.44 days,
-- a year 365.25 days).
CREATE FUNCTION chime_duration_ms(duration text) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    WITH parts AS (
        SELECT m[1]::numeric AS n,
               CASE m[2]
                   WHEN 'nsec' THEN 0.000001 WHEN 'ns' THEN 0.000001
                   WHEN 'usec' THEN 0.001 WHEN 'us' THEN 0.001 WHEN 'µs' THEN 0.001
                   WHEN 'msec' THEN 1 WHEN 'ms' THEN 1
                   WHEN 'seconds' THEN 1000 WHEN 'second' THEN 1000 WHEN 'sec' THEN 1000
                   WHEN 'secs' THEN 1000 WHEN 's' THEN 1000
                   WHEN 'minutes' THEN 60000 WHEN 'minute' THEN 60000 WHEN 'min' THEN 60000
                   WHEN 'mins' THEN 60000 WHEN 'm' THEN 60000
                   WHEN 'hours' THEN 3600000 WHEN 'hour' THEN 3600000 WHEN 'hr' THEN 3600000
                   WHEN 'hrs' THEN 3600000 WHEN 'h' THEN 3600000
                   WHEN 'days' THEN 86400000 WHEN 'day' THEN 86400000 WHEN 'd' THEN 86400000
                   WHEN 'weeks' THEN 604800000 WHEN 'week' THEN 604800000
                   WHEN 'w' THEN 604800000
                   WHEN 'months' THEN 2630016000 WHEN 'month' THEN 2630016000
                   WHEN 'M' THEN 2630016000
                   WHEN 'years' THEN 31557600000 WHEN 'year' THEN 31557600000
                   WHEN 'y' THEN 31557600000
               END AS unit
          FROM regexp_matches(duration, '([0-9]{1,20})\s*([a-zA-Zµ]+)', 'g') AS m
    )
    SELECT CASE WHEN btrim(regexp_replace(duration, '([0-9]{1,20})\s*([a-zA-Zµ]+)', '', 'g')) = ''
                     AND count(*) > 0 AND bool_and(unit IS NOT NULL)
                THEN sum(n * unit) END
      FROM parts
$$;
COMMENT ON FUNCTION chime_duration_ms(text) IS
'Scheduler: milliseconds of a duration in the job file''s form ("10s", "1m 30s", "250ms"), or null when it does not parse.';

-- Attempt `attempt` of run `run_id` failed retryably: retry when (next_attempt_at) or dead
-- (reason), from the run's retry_policy snapshot, as chime_protocol::retry does it (the
-- policy clamped as the trigger carries it: delays at most MAX_RETRY_DELAY, 7 days; multiplier
-- 1 ..= 100). retry_after_ms (the handler's own delay) replaces the backoff, capped by the
-- policy's max. Reads only. No row: no such run.
CREATE FUNCTION chime_retry_decision(run_id bigint, attempt integer, retry_after_ms bigint)
RETURNS TABLE (run_state text, next_attempt_at timestamptz, reason text)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_variable
DECLARE
    max_delay_ms constant numeric := 7 * 86400000; -- limits::MAX_RETRY_DELAY
    policy jsonb;
    grp text;
    max_attempts integer;
    initial_ms numeric;
    max_ms numeric;
    multiplier float8;
    jitter boolean;
    delay_ms numeric;
BEGIN
    SELECT r.retry_policy, r.group_name INTO policy, grp FROM chime_runs r
     WHERE r.id = chime_retry_decision.run_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM chime_require_group(grp, format('run %s', run_id));
    max_attempts := chime_retry_max_attempts(policy);
    IF attempt >= max_attempts THEN
        RETURN QUERY SELECT 'dead'::text, NULL::timestamptz,
                            format('attempts exhausted (%s of %s)', attempt, max_attempts);
        RETURN;
    END IF;
    initial_ms := least(coalesce(chime_duration_ms(policy->>'initial'), 10000), max_delay_ms);
    max_ms := least(coalesce(chime_duration_ms(policy->>'max'), 600000), max_delay_ms);
    multiplier := CASE WHEN jsonb_typeof(policy->'multiplier') = 'number'
                       THEN least(greatest((policy->>'multiplier')::float8, 1), 100)
                       ELSE 2 END;
    jitter := CASE WHEN jsonb_typeof(policy->'jitter') = 'boolean'
                   THEN (policy->>'jitter')::boolean ELSE true END;
    IF retry_after_ms IS NOT NULL THEN
        delay_ms := least(greatest(retry_after_ms, 0), max_ms);
    ELSE
        -- min(max, initial × multiplier^(attempt − 1)), without overflowing a float.
        IF initial_ms = 0 THEN
            delay_ms := 0;
        ELSIF greatest(attempt - 1, 0) * ln(multiplier)
              >= ln(greatest(max_ms, 1) / initial_ms) THEN
            delay_ms := max_ms;
        ELSE
            delay_ms := least(max_ms,
                              round(initial_ms * power(multiplier, greatest(attempt - 1, 0))));
        END IF;
        IF jitter THEN
            -- A uniform factor in [JITTER_MIN, JITTER_MAX] = [0.8, 1.2], capped again.
            delay_ms := least(max_ms, round(delay_ms * (0.8 + 0.4 * random())::numeric));
        END IF;
    END IF;
    RETURN QUERY SELECT 'retrying'::text,
                        clock_timestamp() + delay_ms * interval '1 millisecond',
                        NULL::text;
END
$$;
COMMENT ON FUNCTION chime_retry_decision(bigint, integer, bigint) IS
'Protocol: after attempt `attempt` of run run_id failed retryably: (retrying, next_attempt_at, null) by the run''s retry_policy snapshot (min(max, initial × multiplier^(attempt−1)), ×[0.8, 1.2] with jitter, capped; retry_after_ms instead when given, capped by max), or (dead, null, ''attempts exhausted (n of m)'') once attempt ≥ max_attempts. Reads only; no row: no such run.';

-- ---- triggering a run from code ----------------------------------------------------------

-- The key a caller gives so that asking twice makes one run.
ALTER TABLE chime_runs ADD COLUMN idempotency_key text;
CREATE UNIQUE INDEX chime_runs_idempotency_key ON chime_runs (job_name, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Raises invalid_parameter_value (22023) naming the field (the error's COLUMN), the value
-- (its DETAIL) and the fix (in the message and its HINT).
CREATE FUNCTION chime_invalid(field text, value text, message text, fix text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'invalid_parameter_value',
        COLUMN = field,
        MESSAGE = format('invalid %s: %s; %s', field, message, fix),
        DETAIL = format('%s = %s', field, left(coalesce(value, 'null'), 200)),
        HINT = fix;
END
$$;
COMMENT ON FUNCTION chime_invalid(text, text, text, text) IS
'Scheduler: raises 22023 with COLUMN = field, the value in DETAIL and the fix in the message and HINT.';

CREATE FUNCTION chime_trigger(job text, params jsonb, run_at timestamptz, idempotency_key text,
                              actor text)
RETURNS TABLE (run_id bigint, created boolean)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    the_job chime_jobs%ROWTYPE;
    v_at timestamptz := coalesce(chime_trigger.run_at, now());
    v_params jsonb := chime_trigger.params;
    v_key text := chime_trigger.idempotency_key;
    v_job text := chime_trigger.job;
    v_actor text := chime_trigger.actor;
    v_id bigint;
    v_new boolean := true;
    v_owner boolean := chime_acts_as_owner();
    v_role text;
    v_detail jsonb;
BEGIN
    SELECT * INTO the_job FROM chime_jobs j WHERE j.name = v_job;
    IF NOT FOUND THEN
        PERFORM chime_invalid('job', v_job, 'no such job',
                              'use the name of a job the scheduler knows (chime jobs list)');
    END IF;
    PERFORM chime_require_group(the_job.group_name, format('job %s', v_job));
    IF v_params IS NOT NULL AND jsonb_typeof(v_params) NOT IN ('object', 'null') THEN
        PERFORM chime_invalid('params', left(v_params::text, 200),
                              format('params must be a JSON object, found %s',
                                     CASE jsonb_typeof(v_params) WHEN 'array' THEN 'an array'
                                     ELSE 'a ' || jsonb_typeof(v_params) END),
                              'wrap the value in an object, such as {"batch": 500}');
    END IF;
    IF v_params IS NOT NULL AND octet_length(v_params::text) > 65536 THEN
        PERFORM chime_invalid('params', left(v_params::text, 200),
                              format('%s bytes, over the limit of 65536 bytes',
                                     octet_length(v_params::text)),
                              'pass a reference to the data (a key, a URL) instead of the data');
    END IF;
    IF v_at < now() - interval '1 day' OR v_at > now() + interval '366 days' THEN
        PERFORM chime_invalid('run_at', v_at::text,
                              'not within now - 1 day ..= now + 366 days',
                              'give an instant from a day before now to 366 days after now');
    END IF;
    IF v_key IS NOT NULL AND octet_length(v_key) NOT BETWEEN 1 AND 200 THEN
        PERFORM chime_invalid('idempotency_key', v_key,
                              format('%s bytes, not within 1 ..= 200', octet_length(v_key)),
                              'use a key of 1 to 200 bytes, such as an order id');
    END IF;
    IF v_actor IS NULL OR octet_length(v_actor) NOT BETWEEN 1 AND 256 THEN
        PERFORM chime_invalid('actor', v_actor, 'must be 1 to 256 bytes',
                              'name who triggers the run, such as worker:billing-1');
    END IF;

    IF v_key IS NOT NULL THEN
        SELECT r.id INTO v_id FROM chime_runs r
         WHERE r.job_name = v_job AND r.idempotency_key = v_key;
    END IF;
    IF v_id IS NULL THEN
        INSERT INTO chime_runs AS r (job_name, group_name, scheduled_at, trigger, params, state,
                                     requested_by, idempotency_key)
        VALUES (v_job, the_job.group_name, v_at, 'manual',
                coalesce(v_params, the_job.spec->'params', 'null'), 'pending', v_actor, v_key)
        ON CONFLICT (job_name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING r.id INTO v_id;
        IF v_id IS NULL THEN
            -- A concurrent call with the same key committed first.
            SELECT r.id INTO v_id FROM chime_runs r
             WHERE r.job_name = v_job AND r.idempotency_key = v_key;
            v_new := false;
        END IF;
    ELSE
        v_new := false;
    END IF;

    -- The audit row the API writes for a trigger. The owner (the scheduler's API) passes the
    -- caller's role and the details with secrets hidden in transaction-local settings; any
    -- other caller is recorded as role `worker`, with its database role and the params' keys
    -- only (their values may be secrets, and only the API knows which).
    v_role := CASE WHEN v_owner THEN nullif(current_setting('chime.audit_role', true), '') END;
    v_detail := CASE WHEN v_owner
                     THEN nullif(current_setting('chime.audit_detail', true), '')::jsonb END;
    IF v_detail IS NULL THEN
        v_detail := jsonb_build_object(
            'db_role', session_user::text,
            'param_keys', CASE WHEN jsonb_typeof(v_params) = 'object'
                               THEN (SELECT coalesce(jsonb_agg(k ORDER BY k), '[]')
                                       FROM jsonb_object_keys(v_params) AS k) END);
    END IF;
    v_detail := v_detail || jsonb_build_object('at', v_at, 'idempotency_key', v_key,
                                               'created', v_new);
    INSERT INTO chime_audit (actor, role, action, outcome, job_name, run_id, detail)
    VALUES (v_actor, coalesce(v_role, 'worker'), 'jobs.trigger', 'ok', v_job, v_id, v_detail);

    IF v_new THEN
        -- Wakes the leader's outbox sweep (scheduler::store::OUTBOX_CHANNEL), which publishes
        -- the run within its lead before its instant.
        PERFORM pg_notify('chime_outbox', v_id::text);
    END IF;
    RETURN QUERY SELECT v_id, v_new;
END
$$;
COMMENT ON FUNCTION chime_trigger(text, jsonb, timestamptz, text, text) IS
'Protocol: inserts a pending manual run of job (params: the job''s when null; at run_at, now when null; within now − 1 day ..= now + 366 days) and wakes the outbox; the same (job, idempotency_key) returns the existing run with created = false. Refuses (22023, naming the field) an unknown job, params not a JSON object or over 65536 bytes, a key not of 1..200 bytes. Writes the jobs.trigger audit row.';

-- ---- the worker role's functions, and who may execute what -------------------------------

-- Every function a worker role may EXECUTE: the one list `chime_grant_worker` grants, that
-- docs/protocol.md section 11 names and a test compares with it.
CREATE FUNCTION chime_worker_functions() RETURNS SETOF regprocedure
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
        'chime_may_act_for(text)',
        'chime_worker_online(timestamptz, timestamptz, integer)',
        'chime_worker_beat_deadline(timestamptz, integer)',
        'chime_retry_max_attempts(jsonb)',
        'chime_retry_exhausted(jsonb, integer)'
    ]) AS f
$$;
COMMENT ON FUNCTION chime_worker_functions() IS
'Scheduler: the functions a worker role may execute (chime_grant_worker grants exactly these).';

-- The functions that read or write tables run as their owner, with the search_path pinned to
-- this schema (then pg_temp), so a caller's objects can never stand in for Chime's.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT w FROM chime_worker_functions() AS w
             WHERE w::text NOT LIKE 'chime_worker_online(%'
               AND w::text NOT LIKE 'chime_worker_beat_deadline(%'
               AND w::text NOT LIKE 'chime_retry_max_attempts(%'
               AND w::text NOT LIKE 'chime_retry_exhausted(%' LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp',
                       f, current_schema());
    END LOOP;
END
$$;

-- Functions are executable by PUBLIC by default: no Chime function is. The owner keeps its
-- own right; a worker role gets exactly chime_worker_functions() from chime_grant_worker.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
              WHERE p.pronamespace = current_schema()::regnamespace
                AND p.proname LIKE 'chime\_%' LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;

-- Lets `role` act for executor group `grp`: CONNECT on this database, USAGE on this schema,
-- EXECUTE on chime_worker_functions(), and the grant recorded. No table privilege: the role
-- reaches the data only through those functions. Run by an administrator (`chime workers
-- grant --apply` does); the role must exist. Returns false when it was granted already.
CREATE FUNCTION chime_grant_worker(role name, grp text, granted_by text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_variable
DECLARE
    f regprocedure;
    fresh integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = role) THEN
        PERFORM chime_invalid('role', role, 'no such role',
                              format('create it first: CREATE ROLE %I LOGIN PASSWORD ''…''',
                                     role));
    END IF;
    IF grp IS NULL OR grp !~ '^[a-z0-9][a-z0-9_.-]{0,62}$' THEN
        PERFORM chime_invalid('group', grp,
                              'not an executor group name',
                              'use 1 to 63 characters of a-z, 0-9, _ . - starting with a letter or digit');
    END IF;
    IF (SELECT r.rolsuper OR r.rolbypassrls FROM pg_roles r WHERE r.rolname = role) THEN
        PERFORM chime_invalid('role', role, 'a superuser (or BYPASSRLS) role is not limited by grants',
                              'create a role of its own for the workers of this group');
    END IF;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), role);
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', current_schema(), role);
    FOR f IN SELECT * FROM chime_worker_functions() LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, role);
    END LOOP;
    INSERT INTO chime_worker_grants (role, group_name, granted_by)
    VALUES (role, grp, coalesce(granted_by, session_user::text))
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS fresh = ROW_COUNT;
    RETURN fresh > 0;
END
$$;
COMMENT ON FUNCTION chime_grant_worker(name, text, text) IS
'Scheduler: lets role act for group grp as a worker (CONNECT, schema USAGE, EXECUTE on chime_worker_functions(), recorded in chime_worker_grants); false if it was granted already.';

-- Withdraws `role`'s grant of `grp`; with no group left, its EXECUTE, USAGE and CONNECT too.
-- Returns false when there was no such grant.
CREATE FUNCTION chime_revoke_worker(role name, grp text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_variable
DECLARE
    f regprocedure;
    found_one integer;
BEGIN
    DELETE FROM chime_worker_grants g WHERE g.role = role AND g.group_name = grp;
    GET DIAGNOSTICS found_one = ROW_COUNT;
    IF NOT EXISTS (SELECT 1 FROM chime_worker_grants g WHERE g.role = role)
       AND EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = role) THEN
        FOR f IN SELECT * FROM chime_worker_functions() LOOP
            EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM %I', f, role);
        END LOOP;
        EXECUTE format('REVOKE USAGE ON SCHEMA %I FROM %I', current_schema(), role);
        EXECUTE format('REVOKE CONNECT ON DATABASE %I FROM %I', current_database(), role);
    END IF;
    RETURN found_one > 0;
END
$$;
COMMENT ON FUNCTION chime_revoke_worker(name, text) IS
'Scheduler: withdraws role''s grant of group grp (and, with no group left, its EXECUTE, schema USAGE and CONNECT); false if there was none.';

REVOKE EXECUTE ON FUNCTION chime_grant_worker(name, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION chime_revoke_worker(name, text) FROM PUBLIC;
