//! publish, publish_once, publish_batch on a caller's client or
//! transaction, and the errors they raise as their variants.
#![cfg(feature = "integration")]

mod common;

use common::TestDb;
use litebase_streams_client::{publish, publish_batch, publish_once, Error, PublishOptions};
use serde_json::json;

#[tokio::test]
async fn publishing_is_part_of_the_callers_transaction() {
    let db = TestDb::new().await;
    let mut client = db.client().await;
    let tx = client.transaction().await.unwrap();
    let position = publish(&tx, "orders", &json!({"id": 1}), PublishOptions::default()).await.unwrap();
    tx.rollback().await.unwrap();
    let head: i64 = client.query_one("SELECT streams.stream_head('orders')", &[]).await.unwrap().get(0);
    assert_eq!(head, 0, "rolled back: nothing ({position})");

    let tx = client.transaction().await.unwrap();
    let options = PublishOptions {
        event_type: Some("order.created".into()),
        key: Some("ord_1".into()),
        headers: Some(json!({"trace": "t1"}).as_object().unwrap().clone()),
        ..Default::default()
    };
    let position = publish(&tx, "orders", &json!({"id": 1}), options).await.unwrap();
    tx.commit().await.unwrap();
    let final_: bool = client.query_one("SELECT streams.wait($1)", &[&position]).await.unwrap().get(0);
    assert!(final_);
    let row = client
        .query_one("SELECT type, key, headers::text, data::text FROM streams.events WHERE position = $1", &[&position])
        .await
        .unwrap();
    assert_eq!(row.get::<_, Option<String>>(0).as_deref(), Some("order.created"));
    assert_eq!(row.get::<_, Option<String>>(1).as_deref(), Some("ord_1"));
    assert_eq!(row.get::<_, String>(2), r#"{"trace": "t1"}"#);

    let positions =
        publish_batch(&client, "orders", &[json!(1), json!(2), json!(3)], PublishOptions::default()).await.unwrap();
    assert_eq!(positions.len(), 3);
    assert!(positions.windows(2).all(|w| w[0] < w[1]));

    let first = publish_once(&client, "orders", &json!({"pay": 1}), "k1", PublishOptions::default()).await.unwrap();
    let again = publish_once(&client, "orders", &json!({"pay": 1}), "k1", PublishOptions::default()).await.unwrap();
    assert!(!first.duplicate && again.duplicate && again.position == first.position);
}

#[tokio::test]
async fn errors_come_as_their_variants_with_their_sqlstate() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let stale = PublishOptions { expected_prev: Some(0), ..Default::default() };
    publish(&client, "acct", &json!(1), PublishOptions::default()).await.unwrap();
    let e = publish(&client, "acct", &json!(2), stale).await.unwrap_err();
    assert!(matches!(e, Error::ExpectedVersion(_)), "{e:?}");
    assert_eq!(e.sqlstate(), Some("40001"));
    assert!(e.db_error().and_then(|d| d.detail()).is_some(), "the detail names the newest event");

    publish_once(&client, "acct", &json!({"a": 1}), "same", PublishOptions::default()).await.unwrap();
    let e = publish_once(&client, "acct", &json!({"a": 2}), "same", PublishOptions::default()).await.unwrap_err();
    assert!(matches!(e, Error::IdempotencyConflict(_)), "{e:?}");

    let e = publish(&client, "bad name", &json!(1), PublishOptions::default()).await.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert_eq!(e.sqlstate(), Some("22023"));

    let role = format!("{}_nobody", db.name);
    client
        .batch_execute(&format!("CREATE ROLE {role} LOGIN; SELECT streams.grant('read', '*', '{role}')"))
        .await
        .unwrap();
    let mut config = db.config();
    config.user(&role);
    let other = common::connect(&config).await;
    let e = publish(&other, "acct", &json!(1), PublishOptions::default()).await.unwrap_err();
    assert!(matches!(e, Error::PermissionDenied(_)), "{e:?}");
    drop(other);
    let _ = client.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).await;
}
