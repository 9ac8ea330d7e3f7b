-- Every state change of a run writes a new row version with an entry in each index whose
-- predicate it matches, so each index on chime_runs costs the hot path (insert, mark, claim,
-- outcome) at every run. `chime_runs_active` (job_name, id) over queued, running and retrying
-- runs is a subset of `chime_runs_unfinished` (the same key, pending included), which serves
-- every query that looks for a job's unfinished runs; no query needs the narrower one.
DROP INDEX IF EXISTS chime_runs_active;
