-- Reading a run's tasks in creation order: `chime runs show`, GET /api/runs/{id}/tasks and the
-- dashboard's task grid page through a parent's tasks by id (keyset), and count them by state.
-- The unique index on (parent_id, task_key) finds a parent's tasks but not in id order, so each
-- page would sort every task of the run; this one serves a page as a range scan. Partial: runs
-- without a parent (most rows) are not in it.
CREATE INDEX chime_runs_task_order ON chime_runs (parent_id, id) WHERE parent_id IS NOT NULL;
