-- Section 1c, what capture does written by hand: the same single-row INSERT
-- into the uncaptured table and a publish of the row as capture would
-- publish it (type, key, {"new": row}), in one statement.
WITH r AS (INSERT INTO bench_orders_plain(customer, amount, status) VALUES ('cus_42', 49.00, 'paid') RETURNING *)
SELECT streams.publish('bench.by_hand', jsonb_build_object('new', to_jsonb(r)), type => 'insert',
                       key => jsonb_build_object('id', r.id)::text)
FROM r;
