-- Section 1c: the same single-row INSERT into a captured table
-- (bench_orders, streams.capture('bench_orders', 'bench.orders')): the row and
-- its event, in one transaction.
INSERT INTO bench_orders(customer, amount, status) VALUES ('cus_42', 49.00, 'paid');
