-- How many fires each job's schedule has made, skipped ones included: what a job's `max_runs`
-- counts. The planner's fenced insert of fires (`Store::insert_fires`) adds the schedule's fires
-- it wrote in the same statement as the runs and the cursor, so a new leader reads the count
-- that matches the runs. Manual triggers do not count. Jobs that existed before start at 0: a
-- `max_runs` added to such a job counts from the fires after it.
ALTER TABLE chime_jobs ADD COLUMN scheduled_runs bigint NOT NULL DEFAULT 0;
