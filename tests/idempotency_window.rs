//! The idempotency window (`litebase_streams.idempotency_window`, a
//! server-wide setting: alone in this binary): after it a key publishes
//! again, and the worker deletes the keys it no longer remembers.
#![cfg(feature = "integration")]

mod common;

use std::time::Duration;

use common::*;

#[test]
fn after_the_window_a_key_publishes_again_and_the_worker_forgets_it() {
    let db = TestDb::new();
    let mut c = db.connect();
    let first: i64 = c.query_one("SELECT position FROM streams.publish_once('pay', '{}', 'k')", &[]).unwrap().get(0);
    let _window = SystemSetting::set("litebase_streams.idempotency_window", "1");
    let mut again = None;
    wait_until("the key publishes again", Duration::from_secs(20), || {
        let row = db
            .connect()
            .query_one("SELECT position, duplicate FROM streams.publish_once('pay', '{}', 'k')", &[])
            .unwrap();
        again = (!row.get::<_, bool>(1)).then(|| row.get::<_, i64>(0));
        again.is_some()
    });
    assert_ne!(again, Some(first));
    let stored: i64 = c.query_one("SELECT count(*) FROM streams.event_log WHERE stream = 'pay'", &[]).unwrap().get(0);
    assert_eq!(stored, 2, "one event per window");
    c.batch_execute("SELECT streams.publish('pay', '{}', idempotency_key => 'other')").unwrap();
    wait_until("the worker deletes the forgotten keys", Duration::from_secs(30), || {
        c.query_one("SELECT count(*) FROM streams.idempotency_keys", &[]).unwrap().get::<_, i64>(0) == 0
    });
}
