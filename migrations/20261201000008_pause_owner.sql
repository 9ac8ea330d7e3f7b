-- Who paused a job, shown by `chime jobs list/show` and the API: 'file' when its job file says
-- `paused = true`, otherwise the operator's actor (`cli:alice`, `token:ops`); NULL while it is
-- not paused. Pauses from before this column are attributed to the file when the stored file
-- definition says paused, else to an operator.
ALTER TABLE chime_jobs ADD COLUMN paused_by text;
UPDATE chime_jobs
   SET paused_by = CASE WHEN source = 'config' AND (spec->>'paused')::boolean
                        THEN 'file' ELSE 'operator' END
 WHERE paused;
