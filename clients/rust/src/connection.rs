//! A connection whose notifications come out of a channel.
//!
//! tokio-postgres hands notifications to whoever polls the `Connection`
//! (`poll_message`), so a task of ours drives it and forwards each
//! `AsyncMessage::Notification`; queries keep working on the same client
//! meanwhile. When the connection ends, the channel says so (with the
//! error, when there was one) after the notifications that came before.

use futures_util::{stream, StreamExt};
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, Config, NoTls, Notification};

/// What the connection task forwards.
pub(crate) enum Message {
    Notification(Notification),
    /// The connection is gone (the error, unless it closed cleanly).
    Lost(Option<tokio_postgres::Error>),
}

/// A client, the notifications of its connection, and the task driving it
/// (aborted on drop, which closes the connection).
pub(crate) struct Listening {
    pub client: Client,
    pub messages: mpsc::UnboundedReceiver<Message>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Connect and start forwarding the connection's notifications.
pub(crate) async fn connect(config: &Config) -> Result<Listening, tokio_postgres::Error> {
    let (client, mut connection) = config.connect(NoTls).await?;
    let (sender, messages) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut incoming = stream::poll_fn(move |cx| connection.poll_message(cx));
        let end = loop {
            match incoming.next().await {
                Some(Ok(AsyncMessage::Notification(note))) => {
                    if sender.send(Message::Notification(note)).is_err() {
                        return;
                    }
                }
                Some(Ok(_notice)) => {}
                Some(Err(e)) => break Some(e),
                None => break None,
            }
        };
        let _ = sender.send(Message::Lost(end));
    });
    Ok(Listening { client, messages, task })
}

/// `name` as a quoted SQL identifier (channel names are identifiers).
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    #[test]
    fn channel_names_are_quoted_identifiers() {
        assert_eq!(super::quote_ident("payment.success"), "\"payment.success\"");
        assert_eq!(super::quote_ident("a\"b"), "\"a\"\"b\"");
    }
}
