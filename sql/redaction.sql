-------------------------------------------------------------------------------
-- Redaction (src/log/redact.rs): the one change a stored event may undergo.
-------------------------------------------------------------------------------

-- streams._may_redact(stream text) -> boolean
-- Whether the current user holds a 'redact' grant covering `stream` (null:
-- any stream), as a member of the grantee. No bypass for superusers or the
-- extension's owner: the grant is the record of who may erase.
CREATE FUNCTION streams._may_redact(stream text) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    WITH RECURSIVE member_of(role) AS (
        SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user
        UNION
        SELECT m.roleid FROM pg_catalog.pg_auth_members m JOIN member_of ON m.member = member_of.role
    )
    SELECT EXISTS (SELECT FROM streams.stream_grants g
                   WHERE g.privilege = 'redact'
                     AND g.grantee::pg_catalog.oid IN (SELECT role FROM member_of)
                     AND (_may_redact.stream IS NULL
                          OR streams._stream_matches(_may_redact.stream, ARRAY[g.stream::text])))
$$;
COMMENT ON FUNCTION streams._may_redact(text) IS 'Internal: whether the current user holds a redact grant covering the stream (null: any).';

-- One row per redacted event: readable by the roles that may redact its stream.
CREATE TABLE streams.redactions (
    "position"  bigint PRIMARY KEY,
    stream      text COLLATE "C" NOT NULL,
    redacted_by regrole NOT NULL,
    redacted_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    reason      text NOT NULL
);
ALTER TABLE streams.redactions ENABLE ROW LEVEL SECURITY;
CREATE POLICY redactors ON streams.redactions FOR SELECT USING (streams._may_redact(stream));
SELECT pg_catalog.pg_extension_config_dump('streams.redactions', '');
COMMENT ON TABLE streams.redactions IS 'Every redaction: the event''s position and stream, who redacted it, when and why. Readable by the roles granted redact on the stream.';

-- streams.redact(position bigint, reason text) -> boolean
CREATE FUNCTION streams.redact("position" bigint, reason text) RETURNS boolean
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', 'redact_wrapper';
COMMENT ON FUNCTION streams.redact(bigint, text) IS 'Replace the data of the final event at position with {"redacted": true} (headers with null; position, stream, time, tx, type and key stay) and record it in streams.redactions; false when it was redacted already. Needs the redact grant on the event''s stream.';

-- streams.redact_matching(stream text, reason text, filter jsonb DEFAULT NULL, key text DEFAULT NULL) -> bigint
CREATE FUNCTION streams.redact_matching(stream text, reason text, filter jsonb DEFAULT NULL, key text DEFAULT NULL)
RETURNS bigint
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', 'redact_matching_wrapper';
COMMENT ON FUNCTION streams.redact_matching(text, text, jsonb, text) IS 'Redact every final event of the stream whose data contains filter and whose key is key (at least one of them; filter => ''{}'' selects all); returns how many. Needs the redact grant on the stream.';
