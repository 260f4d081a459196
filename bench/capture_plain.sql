-- Anchor of section 1c: a single-row INSERT into a table nobody captures
-- (bench_orders_plain, created by bench/phases/capture.py).
INSERT INTO bench_orders_plain(customer, amount, status) VALUES ('cus_42', 49.00, 'paid');
