-------------------------------------------------------------------------------
-- Webhooks: committed events POSTed to HTTP endpoints, signed (Standard
-- Webhooks), in position order, retried until delivered (src/webhooks/ has
-- the design).
--
-- A webhook is an ordered subscription (same name, in
-- streams.subscription_state) whose consumer is the extension's webhook
-- worker: its `position` is how far delivery got, and it moves only after
-- the endpoint answered 2xx. The row below holds where and how to deliver.
--
-- Privileges are set in finish.sql: creating a webhook needs EXECUTE on
-- streams.create_webhook, which nobody has until granted.
-------------------------------------------------------------------------------

CREATE TABLE streams.webhook_state (
    subscription    integer PRIMARY KEY REFERENCES streams.subscription_state (id) ON DELETE CASCADE,
    url             text NOT NULL,
    -- whsec_ + base64 of the signing key. Never shown by streams.webhooks.
    secret          text NOT NULL,
    -- The most events one request carries (1: the body is one event).
    batch           integer NOT NULL CHECK (batch BETWEEN 1 AND 1000),
    paused          boolean NOT NULL DEFAULT false,
    -- Set when delivery gave up (410 Gone, too many failures); last_error says why.
    disabled_at     timestamptz,
    -- Failed attempts of the request now pending; 0 after a success.
    attempts        integer NOT NULL DEFAULT 0,
    failing_since   timestamptz,
    next_attempt_at timestamptz,
    last_status     integer,
    last_error      text,
    last_attempt_at timestamptz,
    last_success_at timestamptz,
    -- The last position of the request in flight (or failed last), written
    -- before it is sent: a retry, also after a crash, carries exactly the
    -- events after the position up to it, under the same webhook-id.
    sending_upto    bigint
);

-- Secrets and URLs: row-level security with no policy, so that only the
-- extension's owner (and superusers) read or write the table, also against
-- pg_read_all_data and pg_write_all_data.
ALTER TABLE streams.webhook_state ENABLE ROW LEVEL SECURITY;

SELECT pg_catalog.pg_extension_config_dump('streams.webhook_state', '');

-- The functions run as the caller and check it themselves (like the
-- subscription functions), then use the tables as the extension's owner.
CREATE FUNCTION streams.create_webhook(
    name   text,
    stream text,
    url    text,
    after  bigint  DEFAULT NULL,
    secret text    DEFAULT NULL,
    batch  integer DEFAULT 1,
    types  text[]  DEFAULT NULL,
    filter jsonb   DEFAULT NULL
) RETURNS text
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_create_filtered_webhook_wrapper';
CREATE FUNCTION streams.drop_webhook(name text) RETURNS boolean
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_drop_webhook_wrapper';
CREATE FUNCTION streams.pause_webhook(name text) RETURNS void
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_pause_webhook_wrapper';
CREATE FUNCTION streams.resume_webhook(name text) RETURNS void
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_resume_webhook_wrapper';

-- streams.webhooks: the webhooks of the roles the caller belongs to (the
-- row filter is the one of streams.subscriptions). position: every event
-- of the webhook at or below it was delivered; pending: final events after
-- it; attempts: failed attempts of the pending request.
CREATE VIEW streams.webhooks WITH (security_barrier) AS
SELECT sub.name, sub.stream, w.url,
       CASE WHEN w.disabled_at IS NOT NULL THEN 'disabled'
            WHEN w.paused THEN 'paused'
            WHEN w.attempts > 0 THEN 'retrying'
            ELSE 'active' END AS state,
       sub.position, sub.pending, w.attempts, w.last_status, w.last_error, w.next_attempt_at, sub.lag_time,
       w.batch, sub.owner, w.disabled_at, w.last_attempt_at, w.last_success_at, sub.created_at,
       sub.types, sub.filter
FROM streams.subscriptions sub
JOIN streams.subscription_state s ON s.name = sub.name AND s.owner = sub.owner
JOIN streams.webhook_state w ON w.subscription = s.id;

COMMENT ON TABLE streams.webhook_state IS 'Webhooks: the endpoint, secret and delivery state of each webhook subscription (see streams.webhooks).';
COMMENT ON COLUMN streams.webhook_state.sending_upto IS
    'The last position of the request in flight or last failed, written before it is sent: its retry carries the same events under the same webhook-id.';
COMMENT ON FUNCTION streams.create_webhook(text, text, text, bigint, text, integer, text[], jsonb) IS 'POST every event of a stream (or a pattern: ''prefix.*'', ''order.*.failed'', ''*'') to an http(s) URL, signed; types and filter (data @> filter) keep only the matching events; returns the signing secret.';
COMMENT ON FUNCTION streams.drop_webhook(text) IS 'Drop a webhook and its progress; true if it existed.';
COMMENT ON FUNCTION streams.pause_webhook(text) IS 'Stop delivering to a webhook until resume_webhook.';
COMMENT ON FUNCTION streams.resume_webhook(text) IS 'Deliver again to a paused or disabled webhook, from where it stopped, retrying at once.';
COMMENT ON VIEW streams.webhooks IS 'The webhooks of the caller''s roles: URL, state, delivered position, pending events, attempts, last status and error.';
COMMENT ON COLUMN streams.webhooks.state IS 'active, retrying (the pending request failed; next_attempt_at says when it is tried again), paused, or disabled (last_error says why).';
COMMENT ON COLUMN streams.webhooks.position IS 'Every event of the webhook at or below this position was delivered (a 2xx answer).';
