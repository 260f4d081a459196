//! Hostile tests of publish's envelope, idempotency keys and expected
//! version (issue 25): what a publisher of one stream can do to another's,
//! and edge cases of the arguments.
#![cfg(feature = "integration")]

mod common;

use std::collections::HashMap;

use common::*;

/// 32-bit FNV-1a, as `litebase_streams_core::keys::key_hash` computes it
/// (a name's hash anyone can compute).
fn fnv1a(start: u32, bytes: &[u8]) -> u32 {
    bytes.iter().fold(start, |hash, &byte| (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193))
}

/// A stream name `prefix` + six characters whose 32-bit FNV-1a hash equals
/// that of `target`: meet in the middle, three characters from each side.
fn fnv_collision(prefix: &str, target: &str) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    const INVERSE: u32 = 0x359c_449b; // 0x01000193⁻¹ mod 2³²
    assert_eq!(INVERSE.wrapping_mul(0x0100_0193), 1);
    let goal = fnv1a(0x811c_9dc5, target.as_bytes());
    let start = fnv1a(0x811c_9dc5, prefix.as_bytes());
    let triples =
        || ALPHABET.iter().flat_map(|&a| ALPHABET.iter().flat_map(move |&b| ALPHABET.iter().map(move |&c| [a, b, c])));
    let forward: HashMap<u32, [u8; 3]> = triples().map(|t| (fnv1a(start, &t), t)).collect();
    for tail in triples() {
        // Undo the last three steps from the goal: h = (h * P⁻¹) ^ byte.
        let before = tail.iter().rev().fold(goal, |h, &byte| h.wrapping_mul(INVERSE) ^ u32::from(byte));
        if let Some(head) = forward.get(&before) {
            let name = format!("{prefix}{}{}", std::str::from_utf8(head).unwrap(), std::str::from_utf8(&tail).unwrap());
            assert_eq!(fnv1a(0x811c_9dc5, name.as_bytes()), goal);
            return name;
        }
    }
    panic!("no collision found for {target}");
}

/// A publisher of its own streams only picks a name whose (public, 32-bit)
/// hash is the victim stream's and holds an `expected_prev` transaction
/// open: the victim's `expected_prev` appenders must not wait for it.
#[test]
fn a_publisher_of_other_streams_cannot_hold_a_streams_lock_through_a_hash_collision() {
    let db = TestDb::new();
    let mut owner = db.connect();
    let victim_head = owner.query_one("SELECT streams.publish('ledger', '{}')", &[]).unwrap().get::<_, i64>(0);
    let attacker = TestRole::new(&db, "attacker", "");
    owner.batch_execute(&format!("SELECT streams.grant('publish', 'mine.*', '{}')", attacker.name)).unwrap();
    let colliding = fnv_collision("mine.", "ledger");
    let mut a = db.connect_as(&attacker.name);
    a.batch_execute("BEGIN").unwrap();
    a.query_one("SELECT streams.publish($1, '{}', expected_prev => 0)", &[&colliding]).unwrap();
    owner.batch_execute("SET lock_timeout = '2s'").unwrap();
    let appended = owner.query_one("SELECT streams.publish('ledger', '{}', expected_prev => $1)", &[&victim_head]);
    assert!(
        appended.is_ok(),
        "the victim's append waited for the attacker's stream {colliding:?}: {:?}",
        appended.err().map(|e| sqlstate(&e))
    );
    a.batch_execute("ROLLBACK").unwrap();
}

/// An empty batch writes nothing; retrying it with its idempotency key must
/// not fail as "the key was used for another event" (at position 0), and a
/// later batch with the key is not blocked by the empty one.
#[test]
fn retrying_an_empty_batch_with_an_idempotency_key_succeeds() {
    let db = TestDb::new();
    let mut c = db.connect();
    let batch = "SELECT count(*) FROM streams.publish_batch('s', $1::text::jsonb[], idempotency_key => 'k')";
    for attempt in 0..2 {
        let n: i64 =
            c.query_one(batch, &[&"{}"]).unwrap_or_else(|e| panic!("attempt {attempt}: {}: {e}", sqlstate(&e))).get(0);
        assert_eq!(n, 0);
    }
    let n: i64 = c.query_one(batch, &[&r#"{"{\"a\": 1}"}"#]).expect("the empty batch held no key").get(0);
    assert_eq!(n, 1);
    let again: i64 = c.query_one(batch, &[&r#"{"{\"a\": 1}"}"#]).unwrap().get(0);
    assert_eq!(again, 1, "the retry of the non-empty batch returns its position");
    assert_eq!(count_stored(&mut c), 1);
}
