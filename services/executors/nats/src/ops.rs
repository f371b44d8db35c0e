//! The operations of the `nats` tool: one function per [`Op`], each a few
//! calls of the client and the shape of its result.

use std::time::Duration;

use async_nats::jetstream;
use async_nats::HeaderMap;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;

use crate::{chain, config, failure, Encoding, Failure, Op};

/// A message to send: `publish`, `js_publish` and `request` take one.
struct Message {
    subject: String,
    payload: Bytes,
    headers: Vec<(String, String)>,
}

/// Where one task's operation runs.
pub(crate) struct Session<'a> {
    /// The connection to the task's server.
    pub client: &'a async_nats::Client,
    /// How long a `request` waits for its reply.
    pub read: Duration,
    /// Replicas of a bucket the operation creates.
    pub replicas: usize,
}

impl Session<'_> {
    /// Run `op`; the result's shape depends on the operation.
    pub async fn execute(&self, op: Op) -> Result<Value, Failure> {
        match op {
            Op::Publish {
                subject,
                payload,
                headers,
            } => {
                self.publish(Message {
                    subject,
                    payload,
                    headers,
                })
                .await
            }
            Op::JsPublish {
                subject,
                payload,
                headers,
                stream,
            } => {
                let message = Message {
                    subject,
                    payload,
                    headers,
                };
                self.js_publish(message, stream).await
            }
            Op::Request {
                subject,
                payload,
                headers,
            } => {
                self.request(Message {
                    subject,
                    payload,
                    headers,
                })
                .await
            }
            Op::KvGet { bucket, key } => self.kv_get(bucket, key).await,
            Op::KvPut { bucket, key, value } => self.kv_put(bucket, key, value).await,
            Op::KvDelete { bucket, key } => self.kv_delete(bucket, key).await,
            Op::KvKeys { bucket } => self.kv_keys(bucket).await,
            Op::ObjectGet {
                bucket,
                name,
                encoding,
            } => self.object_get(bucket, name, encoding).await,
            Op::ObjectPut {
                bucket,
                name,
                data,
                description,
            } => {
                let meta = jetstream::object_store::ObjectMetadata {
                    name,
                    description,
                    ..Default::default()
                };
                self.object_put(bucket, meta, data).await
            }
            Op::ObjectDelete { bucket, name } => self.object_delete(bucket, name).await,
        }
    }

    fn js(&self) -> jetstream::Context {
        jetstream::new(self.client.clone())
    }

    async fn publish(&self, m: Message) -> Result<Value, Failure> {
        let Message {
            subject,
            payload,
            headers,
        } = m;
        let n = payload.len();
        let sent = if headers.is_empty() {
            self.client.publish(subject.clone(), payload).await
        } else {
            self.client
                .publish_with_headers(subject.clone(), header_map(&headers), payload)
                .await
        };
        sent.map_err(|e| server_error(&e))?;
        self.client.flush().await.map_err(|e| server_error(&e))?;
        Ok(json!({"subject": subject, "bytes": n}))
    }

    async fn js_publish(&self, m: Message, stream: Option<String>) -> Result<Value, Failure> {
        let mut h = header_map(&m.headers);
        if let Some(s) = &stream {
            h.insert("Nats-Expected-Stream", s.as_str());
        }
        let ack = self
            .js()
            .publish_with_headers(m.subject.clone(), h, m.payload)
            .await
            .map_err(|e| server_error(&e))?
            .await
            .map_err(|e| server_error(&e))?;
        Ok(json!({
            "subject": m.subject,
            "stream": ack.stream,
            "seq": ack.sequence,
            "duplicate": ack.duplicate,
        }))
    }

    async fn request(&self, m: Message) -> Result<Value, Failure> {
        use async_nats::RequestErrorKind;
        let Message {
            subject,
            payload,
            headers,
        } = m;
        let read = self.read;
        let mut req = async_nats::Request::new()
            .payload(payload)
            .timeout(Some(read));
        if !headers.is_empty() {
            req = req.headers(header_map(&headers));
        }
        let reply = self
            .client
            .send_request(subject.clone(), req)
            .await
            .map_err(|e| match e.kind() {
                RequestErrorKind::NoResponders => failure(
                    "nats.no_responders",
                    format!("no one answers on {subject:?}"),
                    true,
                ),
                RequestErrorKind::TimedOut => failure(
                    "timeout",
                    format!("no reply on {subject:?} within {}s", read.as_secs_f64()),
                    true,
                ),
                _ => server_error(&e),
            })?;
        Ok(json!({
            "subject": subject,
            "data": config::from_bytes(&reply.payload),
            "headers": headers_json(reply.headers.as_ref()),
        }))
    }

    async fn kv_get(&self, bucket: String, key: String) -> Result<Value, Failure> {
        let kv = kv_store(&self.js(), &bucket, None).await?;
        let entry = kv.entry(key.clone()).await.map_err(|e| server_error(&e))?;
        // A deleted or purged key reads as a marker entry: not found.
        let entry = entry.filter(|e| e.operation == jetstream::kv::Operation::Put);
        Ok(match entry {
            Some(e) => json!({
                "bucket": bucket, "key": key, "found": true,
                "value": config::from_bytes(&e.value),
                "revision": e.revision, "created": rfc3339(e.created),
            }),
            None => json!({
                "bucket": bucket, "key": key, "found": false, "value": null,
                "revision": null, "created": null,
            }),
        })
    }

    async fn kv_put(&self, bucket: String, key: String, value: Bytes) -> Result<Value, Failure> {
        let kv = kv_store(&self.js(), &bucket, Some(self.replicas)).await?;
        let revision = kv.put(&key, value).await.map_err(|e| server_error(&e))?;
        Ok(json!({"bucket": bucket, "key": key, "revision": revision}))
    }

    async fn kv_delete(&self, bucket: String, key: String) -> Result<Value, Failure> {
        let kv = kv_store(&self.js(), &bucket, None).await?;
        kv.delete(&key).await.map_err(|e| server_error(&e))?;
        Ok(json!({"bucket": bucket, "key": key}))
    }

    async fn kv_keys(&self, bucket: String) -> Result<Value, Failure> {
        let kv = kv_store(&self.js(), &bucket, None).await?;
        let mut keys = kv.keys().await.map_err(|e| server_error(&e))?;
        let mut out = Vec::new();
        while let Some(k) = keys.next().await {
            out.push(Value::String(k.map_err(|e| server_error(&e))?));
        }
        let n = out.len();
        Ok(json!({"bucket": bucket, "keys": out, "count": n}))
    }

    async fn object_get(
        &self,
        bucket: String,
        name: String,
        encoding: Encoding,
    ) -> Result<Value, Failure> {
        use jetstream::object_store::GetErrorKind;
        let store = object_store(&self.js(), &bucket, None).await?;
        let mut obj = store.get(&name).await.map_err(|e| match e.kind() {
            GetErrorKind::NotFound => failure(
                "nats.not_found",
                format!("object {name:?} is not in {bucket:?}"),
                false,
            ),
            _ => server_error(&e),
        })?;
        let mut bytes = Vec::new();
        obj.read_to_end(&mut bytes)
            .await
            .map_err(|e| server_error(&e))?;
        let data = object_data(&name, &bytes, encoding)?;
        Ok(json!({
            "bucket": bucket, "name": name, "data": data, "size": bytes.len(),
            "digest": obj.info().digest,
        }))
    }

    async fn object_put(
        &self,
        bucket: String,
        meta: jetstream::object_store::ObjectMetadata,
        data: Bytes,
    ) -> Result<Value, Failure> {
        let store = object_store(&self.js(), &bucket, Some(self.replicas)).await?;
        let name = meta.name.clone();
        let mut reader: &[u8] = data.as_ref();
        let info = store
            .put(meta, &mut reader)
            .await
            .map_err(|e| server_error(&e))?;
        Ok(json!({"bucket": bucket, "name": name, "size": info.size, "digest": info.digest}))
    }

    async fn object_delete(&self, bucket: String, name: String) -> Result<Value, Failure> {
        let store = object_store(&self.js(), &bucket, None).await?;
        store.delete(&name).await.map_err(|e| server_error(&e))?;
        Ok(json!({"bucket": bucket, "name": name}))
    }
}

/// An object's bytes as its `encoding` asks: base64 text, or UTF-8 text.
fn object_data(name: &str, bytes: &[u8], encoding: Encoding) -> Result<Value, Failure> {
    match encoding {
        Encoding::Base64 => {
            use base64::Engine as _;
            Ok(Value::String(
                base64::engine::general_purpose::STANDARD.encode(bytes),
            ))
        }
        Encoding::Text => match String::from_utf8(bytes.to_vec()) {
            Ok(s) => Ok(Value::String(s)),
            Err(_) => Err(failure(
                "nats.error",
                format!("object {name:?} is not UTF-8 text; read it with `encoding: base64`"),
                false,
            )),
        },
    }
}

fn header_map(headers: &[(String, String)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in headers {
        h.insert(k.as_str(), v.as_str());
    }
    h
}

fn headers_json(h: Option<&HeaderMap>) -> Value {
    let mut out = serde_json::Map::new();
    if let Some(h) = h {
        for (k, vs) in h.iter() {
            let v: Vec<String> = vs.iter().map(|v| v.to_string()).collect();
            out.insert(k.to_string(), Value::String(v.join(", ")));
        }
    }
    Value::Object(out)
}

fn rfc3339(t: time::OffsetDateTime) -> Value {
    t.format(&time::format_description::well_known::Rfc3339)
        .map(Value::String)
        .unwrap_or(Value::Null)
}

fn server_error(e: &dyn std::error::Error) -> Failure {
    let text = chain(e);
    if text.contains("timed out") {
        return failure("timeout", text, true);
    }
    failure("nats.error", text, false)
}

async fn kv_store(
    js: &jetstream::Context,
    bucket: &str,
    create: Option<usize>,
) -> Result<jetstream::kv::Store, Failure> {
    use jetstream::context::KeyValueErrorKind;
    match js.get_key_value(bucket).await {
        Ok(s) => Ok(s),
        Err(e) if e.kind() == KeyValueErrorKind::GetBucket => match create {
            Some(replicas) => js
                .create_key_value(jetstream::kv::Config {
                    bucket: bucket.to_string(),
                    history: 1,
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| server_error(&e)),
            None => Err(failure(
                "nats.not_found",
                format!("KV bucket {bucket:?} does not exist"),
                false,
            )),
        },
        Err(e) => Err(server_error(&e)),
    }
}

async fn object_store(
    js: &jetstream::Context,
    bucket: &str,
    create: Option<usize>,
) -> Result<jetstream::object_store::ObjectStore, Failure> {
    use jetstream::context::ObjectStoreErrorKind;
    match js.get_object_store(bucket).await {
        Ok(s) => Ok(s),
        Err(e) if e.kind() == ObjectStoreErrorKind::GetStore => match create {
            Some(replicas) => js
                .create_object_store(jetstream::object_store::Config {
                    bucket: bucket.to_string(),
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| server_error(&e)),
            None => Err(failure(
                "nats.not_found",
                format!("object store {bucket:?} does not exist"),
                false,
            )),
        },
        Err(e) => Err(server_error(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_read_as_text_or_base64() {
        assert_eq!(
            object_data("o", b"hi", Encoding::Text).unwrap(),
            Value::String("hi".into())
        );
        assert_eq!(
            object_data("o", &[0xff, 0x00], Encoding::Base64).unwrap(),
            Value::String("/wA=".into())
        );
        let f = object_data("o", &[0xff, 0x00], Encoding::Text).unwrap_err();
        assert_eq!(f.kind, "nats.error");
        assert!(f.message.contains("encoding: base64"), "{}", f.message);
    }
}
