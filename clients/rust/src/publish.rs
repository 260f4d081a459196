//! Publishing on a caller's client or transaction: `streams.publish`,
//! `publish_once` and `publish_batch`, each one unnamed statement (no
//! prepared statement outlives it, so it works through PgBouncer in
//! transaction pooling mode). The event is part of the caller's
//! transaction: it becomes visible when that commits, and never if it
//! rolls back.

use serde::Serialize;
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

use crate::Error;

/// The envelope and the guards of a publish. Everything unset by default.
///
/// ```
/// use litebase_streams_client::PublishOptions;
///
/// let options = PublishOptions {
///     event_type: Some("order.paid".into()),
///     key: Some("ord_123".into()),
///     idempotency_key: Some("checkout-7f3a".into()),
///     ..Default::default()
/// };
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Default)]
pub struct PublishOptions {
    /// The event's type (1 to 255 bytes).
    pub event_type: Option<String>,
    /// The event's key, the entity it is about (1 to 1,024 bytes).
    pub key: Option<String>,
    /// Headers: at most 64 string values (traceparent, correlation ids).
    pub headers: Option<serde_json::Map<String, serde_json::Value>>,
    /// Publish at most once per key and stream (within
    /// `litebase_streams.idempotency_window`): a repeat writes nothing and
    /// returns the original position; the same key with other data or
    /// envelope is [`Error::IdempotencyConflict`].
    pub idempotency_key: Option<String>,
    /// The position the stream's newest event must be at (0: the stream has
    /// none), else [`Error::ExpectedVersion`] and nothing is written.
    pub expected_prev: Option<i64>,
}

/// What [`publish_once`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// The event's position (the original one for a duplicate).
    pub position: i64,
    /// The key was remembered: nothing was written.
    pub duplicate: bool,
}

fn json_text<T: Serialize + ?Sized>(data: &T) -> Result<String, Error> {
    serde_json::to_string(data).map_err(|e| Error::Decode(format!("data does not serialise to JSON: {e}")))
}

fn headers_text(options: &PublishOptions) -> Option<String> {
    options.headers.as_ref().map(|h| serde_json::Value::Object(h.clone()).to_string())
}

/// Append one event to `stream` in the caller's transaction (or, on a
/// `Client`, in a transaction of its own) and return its position.
///
/// ```no_run
/// use litebase_streams_client::{publish, PublishOptions};
/// use serde_json::json;
///
/// # async fn run(client: &mut tokio_postgres::Client) -> Result<(), litebase_streams_client::Error> {
/// let tx = client.transaction().await?;
/// tx.execute("UPDATE orders SET paid = true WHERE id = 123", &[]).await?;
/// let position = publish(&tx, "order.paid", &json!({"order_id": 123}), PublishOptions::default()).await?;
/// tx.commit().await?;
/// # let _ = position;
/// # Ok(())
/// # }
/// ```
pub async fn publish<C, T>(client: &C, stream: &str, data: &T, options: PublishOptions) -> Result<i64, Error>
where
    C: GenericClient + Sync,
    T: Serialize + ?Sized,
{
    let data = json_text(data)?;
    let headers = headers_text(&options);
    let row = client
        .query_typed_one(
            "SELECT streams.publish($1, $2::text::jsonb, type => $3, key => $4, headers => $5::text::jsonb,
                                    idempotency_key => $6, expected_prev => $7)",
            &[
                (&stream, Type::TEXT),
                (&data, Type::TEXT),
                (&options.event_type, Type::TEXT),
                (&options.key, Type::TEXT),
                (&headers, Type::TEXT),
                (&options.idempotency_key, Type::TEXT),
                (&options.expected_prev, Type::INT8),
            ],
        )
        .await?;
    Ok(row.try_get(0)?)
}

/// [`publish`] with a required idempotency key, saying whether the key was
/// remembered (`options.idempotency_key` is ignored).
///
/// ```no_run
/// use litebase_streams_client::{publish_once, PublishOptions};
///
/// # async fn run(client: &tokio_postgres::Client) -> Result<(), litebase_streams_client::Error> {
/// let data = serde_json::json!({"order_id": 123});
/// let first = publish_once(client, "order.paid", &data, "pay-123", PublishOptions::default()).await?;
/// let again = publish_once(client, "order.paid", &data, "pay-123", PublishOptions::default()).await?;
/// assert!(again.duplicate && again.position == first.position);
/// # Ok(())
/// # }
/// ```
pub async fn publish_once<C, T>(
    client: &C,
    stream: &str,
    data: &T,
    idempotency_key: &str,
    options: PublishOptions,
) -> Result<Published, Error>
where
    C: GenericClient + Sync,
    T: Serialize + ?Sized,
{
    let data = json_text(data)?;
    let headers = headers_text(&options);
    let row = client
        .query_typed_one(
            "SELECT p.position, p.duplicate
             FROM streams.publish_once($1, $2::text::jsonb, $3, type => $4, key => $5,
                                       headers => $6::text::jsonb, expected_prev => $7) p",
            &[
                (&stream, Type::TEXT),
                (&data, Type::TEXT),
                (&idempotency_key, Type::TEXT),
                (&options.event_type, Type::TEXT),
                (&options.key, Type::TEXT),
                (&headers, Type::TEXT),
                (&options.expected_prev, Type::INT8),
            ],
        )
        .await?;
    Ok(Published { position: row.try_get(0)?, duplicate: row.try_get(1)? })
}

/// Append one event per element of `data`, in order, with the same
/// envelope; their positions, increasing. The idempotency key and the
/// expected version are the batch's.
///
/// ```no_run
/// use litebase_streams_client::{publish_batch, PublishOptions};
/// use serde_json::json;
///
/// # async fn run(client: &tokio_postgres::Client) -> Result<(), litebase_streams_client::Error> {
/// let positions = publish_batch(client, "orders.created", &[json!({"id": 1}), json!({"id": 2})],
///                               PublishOptions::default()).await?;
/// assert_eq!(positions.len(), 2);
/// # Ok(())
/// # }
/// ```
pub async fn publish_batch<C, T>(
    client: &C,
    stream: &str,
    data: &[T],
    options: PublishOptions,
) -> Result<Vec<i64>, Error>
where
    C: GenericClient + Sync,
    T: Serialize,
{
    let data = data.iter().map(json_text).collect::<Result<Vec<String>, Error>>()?;
    let headers = headers_text(&options);
    let rows = client
        .query_typed(
            "SELECT p FROM streams.publish_batch($1, $2::text[]::jsonb[], type => $3, key => $4,
                                                headers => $5::text::jsonb, idempotency_key => $6,
                                                expected_prev => $7) p ORDER BY p",
            &[
                (&stream, Type::TEXT),
                (&data, Type::TEXT_ARRAY),
                (&options.event_type, Type::TEXT),
                (&options.key, Type::TEXT),
                (&headers, Type::TEXT),
                (&options.idempotency_key, Type::TEXT),
                (&options.expected_prev, Type::INT8),
            ],
        )
        .await?;
    rows.iter().map(|row| row.try_get(0).map_err(Error::from)).collect()
}
