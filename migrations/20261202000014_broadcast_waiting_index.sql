-- The rescuer looks every tick for broadcast tasks whose worker is gone before they started
-- (`Store::rescue_stranded_broadcasts`: target_worker set, pending, queued or retrying). Without
-- an index of its own that search walks every unfinished run, or, on a table without
-- statistics, every run: 6-9 s a tick on 600,000 runs under the throughput benchmark's load.
-- Only broadcast tasks enter this index, and only while they wait, so runs of other jobs pay
-- the predicate and nothing else.
CREATE INDEX chime_runs_broadcast_waiting ON chime_runs (id)
    WHERE target_worker IS NOT NULL AND state IN ('pending', 'queued', 'retrying');
