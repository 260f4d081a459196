//! A client library for litebase_streams on tokio-postgres.
//!
//! * [`subscribe`]: every event of a stream or pattern, exactly once and in
//!   order, from a [`Cursor`] on: LISTEN, catch-up with `streams.replay`,
//!   then notifications (only the worker's), across worker restarts and
//!   lost connections. Needs a session (no transaction pooler).
//! * [`consume`]: a durable consumer of a subscription (`streams.poll`,
//!   your handler in the same transaction, `streams.ack`; a failure is
//!   nacked). Works through PgBouncer in transaction pooling mode.
//! * [`publish`], [`publish_once`], [`publish_batch`]: append events in
//!   your own transaction.
//!
//! Every event comes as one [`Event`], whatever path it took; every error
//! as one [`Error`], with the server's SQLSTATE ([`Error::sqlstate`]).
//!
//! ```no_run
//! use futures_util::StreamExt;
//! use litebase_streams_client::{publish, subscribe, PublishOptions, SubscribeOptions};
//!
//! # async fn run() -> Result<(), litebase_streams_client::Error> {
//! let config: tokio_postgres::Config = "host=localhost dbname=app user=postgres".parse().unwrap();
//! let mut events = subscribe(config.clone(), "payment.*", SubscribeOptions::default());
//!
//! let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
//! tokio::spawn(connection);
//! publish(&client, "payment.success", &serde_json::json!({"amount": 49}), PublishOptions::default()).await?;
//!
//! let event = events.next().await.expect("the stream goes on")?;
//! assert_eq!(event.stream, "payment.success");
//! # Ok(())
//! # }
//! ```

mod connection;
mod consume;
mod error;
mod event;
mod publish;
mod subscribe;

pub use consume::{consume, ConsumeOptions, ConsumeReport, HandlerError, HandlerFuture};
pub use error::Error;
pub use event::{Cursor, Event};
pub use publish::{publish, publish_batch, publish_once, PublishOptions, Published};
pub use subscribe::{subscribe, ErrorHook, SubscribeOptions, Subscription, TestHooks};
