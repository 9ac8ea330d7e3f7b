-- Numbered definition versions: every applied change of a job's definition (a job file loaded at
-- start, SIGHUP or --watch reload; a job created, changed or rolled back through the API or the
-- CLI) is a new version, with who made it and when, and each run records the version it ran
-- under. A trigger writes them, so no path that stores a definition can skip it.
--
-- `chime.actor` is a transaction-local setting the writer sets (`set_config(.., true)`):
-- `file` for job files, the caller's actor (`token:ops`, `cli:alice`) for the API and the CLI.
-- Versions of a deleted job stay, and a job created again under the same name goes on
-- numbering after them, so a run's (job, version) always names one definition.
CREATE TABLE chime_job_versions (
    job_name   text        NOT NULL,
    version    integer     NOT NULL CHECK (version > 0),
    spec       jsonb       NOT NULL,
    source     text        NOT NULL,
    actor      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_name, version)
);

ALTER TABLE chime_jobs ADD COLUMN version integer NOT NULL DEFAULT 0;
ALTER TABLE chime_runs ADD COLUMN job_version integer;

-- Jobs that exist now are version 1, as they are.
INSERT INTO chime_job_versions (job_name, version, spec, source, actor, created_at)
SELECT name, 1, spec, source, 'migration', updated_at FROM chime_jobs;
UPDATE chime_jobs SET version = 1;

CREATE FUNCTION chime_job_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF NEW.spec = OLD.spec AND NEW.source = OLD.source THEN
            NEW.version := OLD.version;
            RETURN NEW;
        END IF;
        NEW.version := OLD.version + 1;
    ELSE
        -- An INSERT … ON CONFLICT DO UPDATE of an existing job is versioned by its UPDATE.
        IF EXISTS (SELECT 1 FROM chime_jobs WHERE name = NEW.name) THEN
            RETURN NEW;
        END IF;
        NEW.version := coalesce(
            (SELECT max(version) FROM chime_job_versions WHERE job_name = NEW.name), 0) + 1;
    END IF;
    INSERT INTO chime_job_versions (job_name, version, spec, source, actor)
    VALUES (NEW.name, NEW.version, NEW.spec, NEW.source,
            coalesce(nullif(current_setting('chime.actor', true), ''), NEW.source));
    RETURN NEW;
END;
$$;

CREATE TRIGGER chime_job_version BEFORE INSERT OR UPDATE OF spec, source ON chime_jobs
    FOR EACH ROW EXECUTE FUNCTION chime_job_version();

-- A run records the version of its job's definition when it is made. The planner's insert sets
-- it itself (it reads the job row anyway); this fills it for every other path that makes a run
-- of a job (manual triggers through chime_trigger), so none can leave it out. Tasks belong to
-- their parent run, which has it.
CREATE FUNCTION chime_run_job_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.job_version IS NULL AND NEW.parent_id IS NULL THEN
        NEW.job_version := (SELECT version FROM chime_jobs WHERE name = NEW.job_name);
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER chime_run_job_version BEFORE INSERT ON chime_runs
    FOR EACH ROW EXECUTE FUNCTION chime_run_job_version();

-- Trigger functions only: nobody calls them (a trigger runs its function whatever the
-- inserting role may execute).
REVOKE EXECUTE ON FUNCTION chime_job_version() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION chime_run_job_version() FROM PUBLIC;
