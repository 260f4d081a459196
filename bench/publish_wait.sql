-- One event per transaction, then wait until it is visible: every delivery
-- round finds exactly one event. For bench/profile-worker.sh, to measure what
-- a round costs at low rates: PROFILE_SCRIPT=publish_wait.sql bench/profile-worker.sh 1 6
SELECT streams.publish('payment.success', '{"order_id":"ord_123","amount":49.00}') AS p \gset
SELECT streams.wait(:p)
