-- Dead letters in the database: the leader drains each group's parking-lot queue into this
-- table (about once a second), and every read (`chime dlq list`, GET /api/dead-letters, the
-- dashboard) reads the table, never the queue. Reading a queue would mean fetching and
-- returning messages, which on a quorum queue counts as a delivery every time.

CREATE TABLE chime_dead_letters (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    group_name     text        NOT NULL,
    -- The message id (or the trigger's run id); no foreign key: a message may name a run that
    -- retention deleted, or none at all.
    run_id         bigint,
    job_name       text,
    attempt        integer,
    reason         text,
    parked_by      text,
    error          text,
    parked_at      timestamptz,
    message_id     text,
    content_type   text,
    -- Every header as JSON, each string value cut to the header bound.
    headers        jsonb       NOT NULL DEFAULT '{}',
    -- The body, cut to the largest trigger a worker decodes; `body_truncated` says if it was.
    body           bytea       NOT NULL,
    body_truncated boolean     NOT NULL DEFAULT false,
    -- SHA-256 of the message as drained (properties, headers but the broker's delivery count,
    -- body): a message drained twice (the leader stopped between commit and ack) is kept once.
    fingerprint    bytea       NOT NULL,
    drained_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (group_name, fingerprint)
);
-- Pages of one group's dead letters in drain order; one run's dead letters.
CREATE INDEX chime_dead_letters_group ON chime_dead_letters (group_name, id);
CREATE INDEX chime_dead_letters_run ON chime_dead_letters (run_id) WHERE run_id IS NOT NULL;
