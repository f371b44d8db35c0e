//! Several keys of a KV bucket in one round trip: JetStream's batched
//! direct get (`multi_last`, nats-server 2.11 and later) asks for the last
//! value of every subject matching a few patterns, and the server answers
//! with one message per key and an end-of-batch marker. A status read of
//! an execution (its header and every step record) is one request this
//! way instead of one get per key.
//!
//! Direct gets are off on replicated buckets (see
//! `topology::read_from_leader`): there [`last_values`] answers `None` and
//! the caller reads key by key through the leader.

use std::time::Duration;

use async_nats::jetstream::kv::Store;
use futures::StreamExt;

use crate::MeshError;

/// One key's last value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key, without the bucket's subject prefix.
    pub key: String,
    /// Its revision (the stream sequence).
    pub revision: u64,
    /// The value.
    pub value: bytes::Bytes,
}

/// How long a batch may take before it is abandoned.
const BATCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Most keys one batch returns; a pattern matching more is refused
/// (callers ask for one execution's keys).
pub const MAX_BATCH: usize = 1024;

/// The last value of every key matching one of `patterns` (key patterns
/// with `*` and `>`, e.g. `<eid>.step.>`), deleted keys left out; `None`
/// when the bucket does not allow direct gets.
pub async fn last_values(
    client: &async_nats::Client,
    store: &Store,
    patterns: &[String],
) -> Result<Option<Vec<KeyValue>>, MeshError> {
    if !store.stream.cached_info().config.allow_direct {
        return Ok(None);
    }
    let failed = |message: String| MeshError::Kv {
        bucket: store.name.clone(),
        key: patterns.join(", "),
        message,
    };
    let request = serde_json::json!({
        "multi_last": patterns.iter().map(|p| format!("{}{p}", store.prefix)).collect::<Vec<_>>(),
        "batch": MAX_BATCH,
    });
    let inbox = client.new_inbox();
    let mut replies = client
        .subscribe(inbox.clone())
        .await
        .map_err(|e| failed(e.to_string()))?;
    client
        .publish_with_reply(
            format!("$JS.API.DIRECT.GET.{}", store.stream_name),
            inbox,
            request.to_string().into(),
        )
        .await
        .map_err(|e| failed(e.to_string()))?;
    let mut out = Vec::new();
    loop {
        let next = tokio::time::timeout(BATCH_TIMEOUT, replies.next()).await;
        let message = match next {
            Ok(Some(m)) => m,
            Ok(None) => return Err(failed("the reply subscription ended".into())),
            Err(_) => return Err(failed(format!("no end of batch in {BATCH_TIMEOUT:?}"))),
        };
        match reply_of(&message, &store.prefix) {
            Reply::Value(kv) => out.push(kv),
            Reply::Deleted => {}
            Reply::End => return Ok(Some(out)),
            Reply::Incomplete => return Ok(None),
            Reply::Failed(why) => return Err(failed(why)),
        }
    }
}

/// What one message of a batch says.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    /// A key's value.
    Value(KeyValue),
    /// A key whose last operation deleted or purged it.
    Deleted,
    /// The end of the batch (also: nothing matched).
    End,
    /// More keys match than one batch returns (413, or an end of batch
    /// with keys pending): read them another way.
    Incomplete,
    /// The server refused the request.
    Failed(String),
}

/// Read one reply of a batch: a status (204 end of batch, 404 nothing
/// matched, 413 too many keys, anything else an error) or a stored message
/// with its subject and sequence in the headers.
fn reply_of(message: &async_nats::Message, prefix: &str) -> Reply {
    let header = |name: &str| {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_string())
    };
    if let Some(status) = message.status {
        let pending = header("Nats-Num-Pending").and_then(|p| p.parse::<u64>().ok());
        return match status.as_u16() {
            204 if pending.unwrap_or(0) > 0 => Reply::Incomplete,
            204 | 404 => Reply::End,
            413 => Reply::Incomplete,
            code => Reply::Failed(format!(
                "batched get refused: {code} {}",
                message.description.as_deref().unwrap_or("")
            )),
        };
    }
    if matches!(header("KV-Operation").as_deref(), Some("DEL" | "PURGE")) {
        return Reply::Deleted;
    }
    let (Some(subject), Some(sequence)) = (header("Nats-Subject"), header("Nats-Sequence")) else {
        return Reply::Failed("a batched get reply without Nats-Subject or Nats-Sequence".into());
    };
    let Some(key) = subject.strip_prefix(prefix) else {
        return Reply::Failed(format!(
            "a batched get reply for {subject}, outside the bucket"
        ));
    };
    match sequence.parse() {
        Ok(revision) => Reply::Value(KeyValue {
            key: key.to_string(),
            revision,
            value: message.payload.clone(),
        }),
        Err(_) => Reply::Failed(format!("a batched get reply with sequence {sequence:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_nats::HeaderMap;

    fn message(
        headers: &[(&str, &str)],
        status: Option<u16>,
        payload: &str,
    ) -> async_nats::Message {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(*k, *v);
        }
        async_nats::Message {
            subject: "_INBOX.x".into(),
            reply: None,
            payload: payload.to_string().into(),
            headers: Some(map),
            status: status.map(|s| async_nats::StatusCode::from_u16(s).unwrap()),
            description: None,
            length: 0,
        }
    }

    #[test]
    fn a_value_is_its_key_without_the_prefix_and_its_sequence() {
        let m = message(
            &[
                ("Nats-Subject", "$KV.exec.e1.step.a"),
                ("Nats-Sequence", "42"),
            ],
            None,
            "{}",
        );
        assert_eq!(
            reply_of(&m, "$KV.exec."),
            Reply::Value(KeyValue {
                key: "e1.step.a".into(),
                revision: 42,
                value: "{}".into()
            })
        );
    }

    #[test]
    fn statuses_end_the_batch_or_fail_it_and_deletions_are_skipped() {
        assert_eq!(
            reply_of(&message(&[], Some(204), ""), "$KV.exec."),
            Reply::End
        );
        assert_eq!(
            reply_of(&message(&[], Some(404), ""), "$KV.exec."),
            Reply::End
        );
        let cut = message(&[("Nats-Num-Pending", "3")], Some(204), "");
        assert_eq!(reply_of(&cut, "$KV.exec."), Reply::Incomplete);
        assert_eq!(
            reply_of(&message(&[], Some(413), ""), "$KV.exec."),
            Reply::Incomplete
        );
        assert!(matches!(
            reply_of(&message(&[], Some(408), ""), "$KV.exec."),
            Reply::Failed(_)
        ));
        let deleted = message(
            &[
                ("Nats-Subject", "$KV.exec.e1"),
                ("Nats-Sequence", "7"),
                ("KV-Operation", "DEL"),
            ],
            None,
            "",
        );
        assert_eq!(reply_of(&deleted, "$KV.exec."), Reply::Deleted);
        let foreign = message(
            &[("Nats-Subject", "other.e1"), ("Nats-Sequence", "7")],
            None,
            "",
        );
        assert!(matches!(reply_of(&foreign, "$KV.exec."), Reply::Failed(_)));
    }
}
