-- Control: the same row INSERTed into bench_log_parted, the same table
-- partitioned by range of position with one partition
-- (bench/partitions_schema.sql): against bench/partitions_plain_insert.sql,
-- the cost of partition routing alone.
INSERT INTO bench_log_parted (stream, data) VALUES ('payment.success', '{"order_id":"ord_123","amount":49.00}');
