-- Failure handling: retries, cancellation, replay, rescue, alerts.

-- When a `retrying` run's next attempt is due (the rescuer republishes runs stuck long past it).
ALTER TABLE chime_runs ADD COLUMN next_attempt_at timestamptz;
-- Cancellation requested by an operator (`chime runs cancel`) or by the `replace` policy.
ALTER TABLE chime_runs ADD COLUMN cancel_requested_at timestamptz;
ALTER TABLE chime_runs ADD COLUMN cancel_requested_by text;
-- Who replayed a dead run from the parking lot, and when.
ALTER TABLE chime_runs ADD COLUMN replayed_by text;
ALTER TABLE chime_runs ADD COLUMN replayed_at timestamptz;

-- Active runs of a job (concurrency policies) and running runs of a worker (rescuer).
CREATE INDEX chime_runs_active ON chime_runs (job_name, id) WHERE state IN ('queued', 'running', 'retrying');
CREATE INDEX chime_runs_running_worker ON chime_runs (worker_id) WHERE state = 'running';
CREATE INDEX chime_runs_retrying ON chime_runs (next_attempt_at) WHERE state = 'retrying';
CREATE INDEX chime_attempts_finished ON chime_attempts (finished_at) WHERE state IN ('timed_out', 'lost');
CREATE INDEX chime_runs_finished ON chime_runs (finished_at) WHERE state IN ('dead', 'failed');

-- Alerts sent (or attempted), for rate limiting across leader changes and for operators.
CREATE TABLE chime_alerts (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind      text        NOT NULL CHECK (kind IN ('dead', 'timeout', 'worker_lost', 'consecutive_failures')),
    job_name  text,
    group_name text,
    run_id    bigint,
    target    text        NOT NULL,
    at        timestamptz NOT NULL DEFAULT now(),
    delivered boolean     NOT NULL,
    error     text,
    payload   jsonb       NOT NULL
);
CREATE INDEX chime_alerts_recent ON chime_alerts (job_name, kind, at DESC);
