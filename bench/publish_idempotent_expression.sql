-- bench/publish_idempotent.sql as it was before 2026-12-02: the key built
-- by an expression that every statement parses and plans (compare the two
-- with bench/compare-publish.sh).
\set k random(1, 9000000000000000)
SELECT streams.publish('payment.success', '{"order_id":"ord_123","amount":49.00}',
                       idempotency_key => 'checkout-' || :k || '-' || :client_id);
