-- Chime core schema: leader lease, jobs, runs, attempts, run log lines, workers.
-- Forward only: never edit an applied migration, add a new one.

-- One row per scheduler cluster. Acquired and renewed by a compare-and-set on the DB clock;
-- `term` is bumped on every takeover and fences every leader write.
CREATE TABLE chime_leader (
    name        text PRIMARY KEY,
    holder      text,
    term        bigint      NOT NULL DEFAULT 0,
    elected_at  timestamptz,
    expires_at  timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO chime_leader (name) VALUES ('default');

-- Job definitions, from config files (source = 'config') or created at runtime (source = 'api').
-- `spec` is the validated definition (schedule, time zone, params, policies) as JSON.
-- `cursor_at` is the last scheduled instant the leader has turned into a run (or a skip):
-- the persisted schedule cursor that makes catch-up after an outage possible.
CREATE TABLE chime_jobs (
    name        text PRIMARY KEY,
    group_name  text        NOT NULL,
    spec        jsonb       NOT NULL,
    source      text        NOT NULL DEFAULT 'config' CHECK (source IN ('config', 'api')),
    paused      boolean     NOT NULL DEFAULT false,
    cursor_at   timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per fire (scheduled or manual). State machine (docs/runs.md):
--   pending -> queued -> running [-> retrying -> running ...] -> succeeded | failed | dead | cancelled
--   skipped (never published; `reason` says why)
CREATE TABLE chime_runs (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_name      text        NOT NULL,
    group_name    text        NOT NULL,
    scheduled_at  timestamptz NOT NULL,
    trigger       text        NOT NULL CHECK (trigger IN ('schedule', 'catchup', 'manual')),
    params        jsonb       NOT NULL DEFAULT 'null',
    state         text        NOT NULL CHECK (state IN ('pending', 'queued', 'running', 'retrying',
                                                       'succeeded', 'failed', 'dead', 'cancelled',
                                                       'skipped')),
    reason        text,
    term          bigint,
    attempt       integer     NOT NULL DEFAULT 0,
    worker_id     text,
    error         text,
    requested_by  text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz,
    started_at    timestamptz,
    finished_at   timestamptz
);
-- Exactly one run per scheduled fire. Manual triggers carry their request instant and may repeat.
CREATE UNIQUE INDEX chime_runs_fire_key ON chime_runs (job_name, scheduled_at) WHERE trigger <> 'manual';
CREATE INDEX chime_runs_job_recent ON chime_runs (job_name, id DESC);
-- The outbox: persisted but not yet confirmed by the broker.
CREATE INDEX chime_runs_outbox ON chime_runs (scheduled_at) WHERE state = 'pending';

-- One row per execution attempt of a run, written by the worker SDK.
CREATE TABLE chime_attempts (
    run_id       bigint      NOT NULL REFERENCES chime_runs (id) ON DELETE CASCADE,
    attempt      integer     NOT NULL,
    worker_id    text        NOT NULL,
    state        text        NOT NULL CHECK (state IN ('running', 'succeeded', 'failed', 'timed_out',
                                                      'cancelled', 'lost')),
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    duration_ms  bigint,
    error        text,
    PRIMARY KEY (run_id, attempt)
);

-- Log lines a handler wrote through its context logger, stored with the run.
CREATE TABLE chime_run_logs (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id   bigint      NOT NULL REFERENCES chime_runs (id) ON DELETE CASCADE,
    attempt  integer     NOT NULL,
    at       timestamptz NOT NULL,
    level    text        NOT NULL,
    message  text        NOT NULL
);
CREATE INDEX chime_run_logs_run ON chime_run_logs (run_id, id);

-- Worker registry and heartbeats.
CREATE TABLE chime_workers (
    id            text PRIMARY KEY,
    group_name    text        NOT NULL,
    hostname      text        NOT NULL,
    capacity      integer     NOT NULL,
    jobs          text[]      NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    stopped_at    timestamptz
);
