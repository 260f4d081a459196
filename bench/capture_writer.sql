-- Section 1c, the handoff's writers: on the captured bench_big (-D rows=N, its
-- initial size), 70% UPDATE of a random row, 20% INSERT of a new row, 10%
-- DELETE of a random row.
\set id random(1, :rows)
\set r random(1, 10)
\if :r <= 7
UPDATE bench_big SET v = v + 1 WHERE id = :id;
\elif :r <= 9
INSERT INTO bench_big(v, pad) VALUES (0, 'inserted by a writer');
\else
DELETE FROM bench_big WHERE id = :id;
\endif
