-- Worker side of failure handling: each worker's own heartbeat interval, so that anyone (another
-- worker taking over a redelivered run, the scheduler's rescuer) can judge it lost the same way:
--   lost  <=>  stopped_at IS NOT NULL
--          OR  heartbeat_at < now() - 3 * heartbeat_interval_ms * interval '1 millisecond'
-- Rows written by workers that predate this column beat every 5 s, hence the default.
ALTER TABLE chime_workers
    ADD COLUMN heartbeat_interval_ms integer NOT NULL DEFAULT 5000
        CHECK (heartbeat_interval_ms > 0);
