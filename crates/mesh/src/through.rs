//! Reading a stream through the last message its leader held when the
//! read began (docs/architecture.md "Reading the log"): an ephemeral
//! ordered consumer lands on any replica, and one that lags says nothing
//! is pending before it has the latest messages. The event log's reads
//! ([`crate::Mesh::visit_stored_events`]) and the buckets' scans
//! ([`crate::kv::keys_under`]) both end here.

use std::ops::ControlFlow;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull::OrderedConfig, Consumer};
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{LastRawMessageError, LastRawMessageErrorKind, Stream};
use async_nats::jetstream::Message;
use futures::StreamExt;

/// The last message of `stream` under `filter`, as its leader holds it (a
/// `STREAM.MSG.GET` by last subject, which followers do not answer):
/// where a read of what is stored now must get to. `None` when nothing is
/// stored under it.
pub(crate) async fn leader_last<I>(
    stream: &Stream<I>,
    filter: &str,
) -> Result<Option<StreamMessage>, LastRawMessageError> {
    match stream.get_last_raw_message_by_subject(filter).await {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether a read is done: the message at `seq` is the last its replica
/// holds under the filter (`left == 0`), and at or past `target`, the last
/// one the stream's leader held when the read began. A lagging replica
/// reports `left == 0` early; the read waits for more.
pub fn read_through(seq: u64, left: u64, target: u64) -> bool {
    left == 0 && seq >= target
}

/// Why a read ([`read`]) ended before its target.
#[derive(Debug)]
pub(crate) enum Short {
    /// No message came for the stall time: the replica does not catch up
    /// (or the consumer, recreated after a server restart, waits for one
    /// that never comes).
    Stalled,
    /// The consumer failed, or ended.
    Failed(String),
}

/// Hand `consumer`'s messages to `visit`, each with its stream sequence,
/// until the one at or past `target`
/// is the last its replica holds, or `visit` breaks; then delete the
/// consumer (whatever the outcome: an ephemeral consumer left behind holds
/// server memory until it expires).
pub(crate) async fn read<I>(
    stream: &Stream<I>,
    consumer: Consumer<OrderedConfig>,
    target: u64,
    stall: Duration,
    mut visit: impl FnMut(u64, &Message) -> ControlFlow<()>,
) -> Result<(), Short> {
    let name = consumer.cached_info().name.clone();
    let read = async {
        let failed = |e: &dyn std::fmt::Display| Short::Failed(e.to_string());
        let mut messages = consumer.messages().await.map_err(|e| failed(&e))?;
        loop {
            let m = match tokio::time::timeout(stall, messages.next()).await {
                Ok(Some(m)) => m.map_err(|e| failed(&e))?,
                Ok(None) => return Err(failed(&"the reader's consumer ended")),
                Err(_) => return Err(Short::Stalled),
            };
            let info = m.info().map_err(|e| failed(&e))?;
            let (seq, left) = (info.stream_sequence, info.pending);
            if visit(seq, &m).is_break() || read_through(seq, left, target) {
                return Ok(());
            }
        }
    };
    let read = read.await;
    let _ = stream.delete_consumer(&name).await;
    read
}

#[cfg(test)]
mod tests {
    use super::read_through;

    #[test]
    fn a_read_ends_only_at_the_leaders_last_and_nothing_pending() {
        // A replica that lags says nothing is pending before it has the
        // leader's last message: the read goes on.
        assert!(!read_through(7, 0, 9));
        assert!(!read_through(9, 2, 9), "more stored since the read began");
        assert!(read_through(9, 0, 9));
        assert!(
            read_through(12, 0, 9),
            "messages stored after the read began"
        );
    }
}
