-- The baseline of publish_expected.sql: the same read of the stream's newest
-- position, then a publish without expected_prev.
SELECT coalesce((SELECT max(e.position) FROM streams.event_log e WHERE e.stream = 'account.' || :client_id), 0),
       streams.publish('account.' || :client_id, '{"order_id":"ord_123","amount":49.00}');
