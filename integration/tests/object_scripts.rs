//! Scripts from object storage (docs/tools.md, "Scripts"): a python task
//! whose `script` is an `s3://` object (s3s-fs, `make setup`) and one
//! whose script is a `gs://` object (gcp-storage-emulator, `make setup`),
//! each read with the keychain entry its `source.auth` names; a missing
//! object fails the task with kind `script`, naming the URL and no
//! credential.

use std::time::Duration;

use noetl_integration::Cluster;
use noetl_mesh::{credentials::Credential, state::ExecStatus};
use noetl_testkit::gcs::GcsEmulator;
use noetl_testkit::s3::{S3Server, ACCESS_KEY, SECRET_KEY};
use serde_json::json;

const PLAYBOOK: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: object_scripts }
keychain:
  - { name: s3_main, kind: secret }
  - { name: gcs_main, kind: secret }
workload: { bucket: "" }
workflow:
  - step: start
    tool:
      - name: from_s3
        kind: python
        args: { n: 20 }
        script:
          uri: "s3://{{ workload.bucket }}/scripts/double.py"
          source: { type: s3, auth: s3_main }
        spec: { policy: { rules: [ { when: "{{ outcome.status == 'error' }}", then: { do: fail } }, { else: { then: { do: continue, set_ctx: { s3: "{{ outcome.result }}" } } } } ] } }
      - name: from_gcs
        kind: python
        args: { name: ada }
        script:
          uri: "gs://scripts/greet.py"
          source: { type: gcs, auth: gcs_main }
        spec: { policy: { rules: [ { when: "{{ outcome.status == 'error' }}", then: { do: fail } }, { else: { then: { do: continue, set_ctx: { gcs: "{{ outcome.result }}" } } } } ] } }
      - name: missing
        kind: python
        script:
          uri: "s3://{{ workload.bucket }}/scripts/gone.py"
          source: { type: s3, auth: s3_main }
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: { do: continue, set_ctx: { missing: "{{ outcome.error }}" } }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_scripts_load_from_s3_and_gcs_with_their_keychain_entries() {
    let s3 = S3Server::start("scripts-bucket");
    std::fs::create_dir_all(s3.dir().join("scripts-bucket/scripts")).unwrap();
    std::fs::write(
        s3.dir().join("scripts-bucket/scripts/double.py"),
        "result = {'doubled': n * 2}\n",
    )
    .unwrap();
    let gcs = GcsEmulator::start();
    // gcp-storage-emulator routes no percent-encoded bucket name, and
    // object_store encodes `-`: a bucket name of letters.
    gcs.put("scripts", "greet.py", "result = {'hi': name.upper()}\n")
        .await;
    let cluster = Cluster::start().await;
    let vault = cluster.mesh.vault();
    for (name, data) in [
        (
            "s3_main",
            json!({"access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY,
                   "endpoint": s3.endpoint(), "region": "us-east-1"}),
        ),
        ("gcs_main", gcs.credential()),
    ] {
        vault
            .put(&Credential {
                name: name.into(),
                kind: "secret".into(),
                data,
            })
            .await
            .unwrap();
    }
    let eid = cluster
        .submit(
            PLAYBOOK,
            "object_scripts.yaml",
            json!({"bucket": "scripts-bucket"}),
        )
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    assert_eq!(s.ctx["s3"], json!({"doubled": 40}), "{s:?}");
    assert_eq!(s.ctx["gcs"], json!({"hi": "ADA"}), "{s:?}");
    let missing = &s.ctx["missing"];
    assert_eq!(missing["kind"], "script", "{missing}");
    let message = missing["message"].as_str().unwrap();
    assert!(
        message.contains("s3://scripts-bucket/scripts/gone.py")
            && message.contains("no such object"),
        "{message}"
    );
    assert!(!message.contains(SECRET_KEY), "{message}");
    cluster.stop().await;
}
