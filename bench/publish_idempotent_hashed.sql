-- bench/publish_idempotent_ordered.sql's key hashed (md5): the same
-- expression cost, with the keys spread over the whole primary key.
SELECT streams.publish('payment.success', '{"order_id":"ord_123","amount":49.00}',
                       idempotency_key => pg_catalog.md5(pg_catalog.clock_timestamp()::text || ':client_id'));
