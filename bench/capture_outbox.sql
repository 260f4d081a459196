-- Section 1c, the hand-rolled alternative: the same INSERT into a table whose
-- row trigger INSERTs the row as JSON into an outbox table and calls pg_notify
-- (bench_orders_outbox, bench_outbox_row() in bench/phases/capture.py).
INSERT INTO bench_orders_outbox(customer, amount, status) VALUES ('cus_42', 49.00, 'paid');
