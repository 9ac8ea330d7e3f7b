-- Operations surface: API tokens with roles, the audit log of operator actions, and the
-- indexes the runs page and retention need.

-- API tokens. Only a SHA-256 hash of the secret is stored: secrets are 256-bit random values,
-- so a slow password hash would add nothing. `chime tokens create` prints the secret once.
CREATE TABLE chime_api_tokens (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name          text        NOT NULL UNIQUE,
    role          text        NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    secret_sha256 bytea       NOT NULL UNIQUE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    created_by    text        NOT NULL,
    last_used_at  timestamptz,
    revoked_at    timestamptz
);

-- Every operator action (and every refused one), whoever asked: API token or CLI user.
CREATE TABLE chime_audit (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text        NOT NULL,
    role      text        NOT NULL,
    action    text        NOT NULL,
    outcome   text        NOT NULL CHECK (outcome IN ('ok', 'denied', 'failed')),
    job_name  text,
    run_id    bigint,
    detail    jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX chime_audit_recent ON chime_audit (id DESC);
CREATE INDEX chime_audit_job ON chime_audit (job_name, id DESC) WHERE job_name IS NOT NULL;

-- The runs page filters by state (and job) and pages by id, newest first.
CREATE INDEX chime_runs_state_recent ON chime_runs (state, id DESC);
CREATE INDEX chime_runs_group_recent ON chime_runs (group_name, id DESC);
-- Retention deletes finished runs by age in small batches.
CREATE INDEX chime_runs_created ON chime_runs (created_at);
