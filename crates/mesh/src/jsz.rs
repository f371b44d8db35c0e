//! What a nats-server's monitoring endpoint says of the streams it holds
//! (`/jsz?accounts=true&streams=true`): read by `noetl admin replicas` to
//! compare the replicas of a stream, and by the fault harness to wait for
//! them to agree.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

/// What one server holds of one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Held {
    /// Messages.
    pub messages: u64,
    /// First sequence.
    pub first_seq: u64,
    /// Last sequence.
    pub last_seq: u64,
}

/// The streams of a `/jsz?accounts=true&streams=true` answer, by name.
pub fn streams(jsz: &Value) -> BTreeMap<String, Held> {
    let mut out = BTreeMap::new();
    for account in jsz["account_details"].as_array().into_iter().flatten() {
        for s in account["stream_detail"].as_array().into_iter().flatten() {
            let n = |k: &str| s["state"][k].as_u64().unwrap_or(0);
            if let Some(name) = s["name"].as_str() {
                out.insert(
                    name.to_string(),
                    Held {
                        messages: n("messages"),
                        first_seq: n("first_seq"),
                        last_seq: n("last_seq"),
                    },
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_jsz_answer_gives_each_stream_it_hosts() {
        let answer = json!({"account_details": [{"stream_detail": [
            {"name": "NOETL_EVENTS", "state": {"messages": 3, "first_seq": 1, "last_seq": 3}},
            {"name": "KV_noetl_ctx", "state": {"messages": 2, "first_seq": 4, "last_seq": 9}}
        ]}]});
        let v = streams(&answer);
        assert_eq!(v.len(), 2);
        assert_eq!(
            v["KV_noetl_ctx"],
            Held {
                messages: 2,
                first_seq: 4,
                last_seq: 9
            }
        );
        assert!(streams(&json!({})).is_empty());
    }
}
