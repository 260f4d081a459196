-- An idempotency key that grows with time (a timestamp and the client), so
-- that each new key goes to the right end of the keys' primary key.
SELECT streams.publish('payment.success', '{"order_id":"ord_123","amount":49.00}',
                       idempotency_key => pg_catalog.clock_timestamp()::text || ':client_id');
