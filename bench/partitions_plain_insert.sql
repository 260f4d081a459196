-- Control: the row streams.publish writes (bench/publish.sql), INSERTed into
-- bench_log_plain, a non-partitioned table of the log's shape
-- (bench/partitions_schema.sql).
INSERT INTO bench_log_plain (stream, data) VALUES ('payment.success', '{"order_id":"ord_123","amount":49.00}');
