//! The result store configured the standard AWS way: `AWS_ENDPOINT`,
//! `AWS_ALLOW_HTTP` and keys in the environment, only the bucket from
//! `NOETL_OBJECT_STORE`, against a real S3 server (`s3s-fs`). The
//! environment is passed in, never set on the process, so nothing races
//! other tests.

use noetl_mesh::objects::{is_ref, PutParams, ResultStore, StoreLocation};
use serde_json::json;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn aws_environment_alone_reaches_the_bucket() {
    let s3 = noetl_testkit::S3Server::start("noetl-env");
    let endpoint = s3.endpoint();
    let env = env(&[
        ("AWS_ENDPOINT", &endpoint),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", noetl_testkit::s3::ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", noetl_testkit::s3::SECRET_KEY),
        ("AWS_DEFAULT_REGION", "eu-west-1"),
    ]);
    let location = StoreLocation::parse_with_env("s3://noetl-env/runs/a", &env).unwrap();
    let StoreLocation::S3(loc) = &location else {
        panic!("{location:?}")
    };
    assert_eq!(loc.endpoint, None, "no NOETL_S3_ENDPOINT was given");
    assert_eq!(loc.region, "eu-west-1");
    let store = ResultStore::open_with_env(location, &env).unwrap();

    let value = json!({"rows": (0..200).map(|i| json!({"i": i})).collect::<Vec<_>>()});
    let r = store
        .offload(
            PutParams {
                execution_id: "e1",
                step: "fetch",
                id: "r1",
                value: &value,
            },
            64,
        )
        .await
        .unwrap();
    assert!(is_ref(&r), "{r}");
    assert_eq!(r["store"], "s3");
    assert_eq!(store.hydrate(r.clone()).await.unwrap(), value);
    // The object is in the bucket, under the prefix.
    let file = s3
        .dir()
        .join("noetl-env/runs/a")
        .join(r["key"].as_str().unwrap());
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert_eq!(text.len() as u64, r["size"].as_u64().unwrap());

    // Wrong keys in the environment: the write fails, naming the key and
    // the store, and the secret is not in the message.
    let bad = env
        .iter()
        .map(|(k, v)| {
            let v = if k == "AWS_SECRET_ACCESS_KEY" {
                "wrong-secret-value".to_string()
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect::<Vec<_>>();
    let store = ResultStore::open_with_env(
        StoreLocation::parse_with_env("s3://noetl-env/runs/a", &bad).unwrap(),
        &bad,
    )
    .unwrap();
    let err = store
        .offload(
            PutParams {
                execution_id: "e1",
                step: "fetch",
                id: "r2",
                value: &value,
            },
            64,
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("object store (s3)"), "{err}");
    assert!(err.contains("execution/e1/result/fetch/r2"), "{err}");
    assert!(!err.contains("wrong-secret-value"), "{err}");
}
