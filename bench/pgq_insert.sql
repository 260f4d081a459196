-- Peer: PgQ 3 (postgresql-15-pgq3), one event per transaction with pgq.insert_event,
-- the same type and payload as publish.sql. Queue `bench_publish` (created by
-- bench/phases/publish.py), no consumer, no ticker: the producer's cost alone.
SELECT pgq.insert_event('bench_publish', 'payment.success', '{"order_id":"ord_123","amount":49.00}');
