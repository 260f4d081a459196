-- One event with an idempotency key, new each time (the cost of remembering
-- it: a duplicate writes nothing and is cheaper). The key is a literal, as a
-- client sends it: pgbench puts the variables into the string itself. (An
-- expression such as 'checkout-' || :k would make every statement parse and
-- plan more: the benchmark's cost, not the publish's.)
\set k random(1, 9000000000000000)
SELECT streams.publish('payment.success', '{"order_id":"ord_123","amount":49.00}',
                       idempotency_key => 'checkout-:k-:client_id');
