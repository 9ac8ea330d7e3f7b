-- The planner's count of its own writes: every fenced insert of fires (`Store::insert_fires`)
-- checks that the count is the one this planner last saw and adds one, in the same statement as
-- the runs and cursors it writes. A database that lost writes it had acknowledged (an
-- asynchronous standby promoted after the primary died) has a lower count, so the next write is
-- refused and the planner starts again from the cursors the database has, instead of planning on
-- from what it remembers and leaving the lost fires without a run.
--
-- A row of its own, not a column of `chime_leader`: updating the lease row would make every
-- lease renewal wait behind the fenced writes in flight (docs/benchmarks.md, "Lease renewal
-- under load"). Only the leader's planner writes it.
CREATE TABLE chime_plan_writes (
    name   text PRIMARY KEY,
    writes bigint NOT NULL DEFAULT 0
);
INSERT INTO chime_plan_writes (name) VALUES ('default');
