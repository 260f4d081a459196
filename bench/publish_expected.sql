-- One event appended with expected_prev, each client to a stream of its own
-- (no conflicts): the writer reads the stream's newest position, as an
-- event-sourcing writer reads its version, and appends after it.
SELECT streams.publish('account.' || :client_id, '{"order_id":"ord_123","amount":49.00}',
                       expected_prev => coalesce((SELECT max(e.position) FROM streams.event_log e
                                                  WHERE e.stream = 'account.' || :client_id), 0));
