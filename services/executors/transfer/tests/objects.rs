//! The transfer tool's object sides against real servers: s3s-fs (S3) and
//! gcp-storage-emulator (Google Cloud Storage), both installed by `make
//! setup`, and the machine's PostgreSQL (127.0.0.1:5432, trust auth,
//! database `test`; a throw-away schema per test).

mod support;

use noetl_core::tool::AuthCredential;
use noetl_core::Outcome;
use noetl_testkit::gcs::GcsEmulator;
use noetl_testkit::s3::{S3Server, ACCESS_KEY, SECRET_KEY};
use serde_json::{json, Value};
use support::Schema;

fn pg_cred() -> AuthCredential {
    AuthCredential {
        name: "pg_local".into(),
        kind: "postgres_credential".into(),
        data: json!({"host": "127.0.0.1", "port": 5432, "user": "postgres", "database": "test"}),
    }
}

fn s3_cred(s3: &S3Server) -> AuthCredential {
    AuthCredential {
        name: "s3_main".into(),
        kind: "secret".into(),
        data: json!({"access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY,
                     "endpoint": s3.endpoint(), "region": "us-east-1"}),
    }
}

fn gcs_cred(gcs: &GcsEmulator) -> AuthCredential {
    AuthCredential {
        name: "gcs_main".into(),
        kind: "secret".into(),
        data: gcs.credential(),
    }
}

/// A throw-away schema of this suite's.
async fn schema() -> Schema {
    Schema::new("noetl_xobj", pg_cred()).await
}

async fn transfer(config: Value, auths: &[(&str, AuthCredential)]) -> Outcome {
    support::transfer(config, auths, SECRET_KEY).await
}

const PEOPLE: &str = "select id, name, note, active from $S.people order by id";

#[tokio::test]
async fn postgres_rows_go_to_an_s3_object_and_back_in_each_format() {
    let s3 = S3Server::start("exports");
    let s = schema().await;
    s.sql("create table $S.people (id int primary key, name text, note text, active boolean)")
        .await;
    s.sql(r#"insert into $S.people values (1, 'Ada, L.', 'said "hi"', true), (2, 'Bo', null, false), (3, 'Cy', '', true)"#)
        .await;
    let people = s.sql(PEOPLE).await["rows"].clone();
    s.sql("create table $S.back (id int primary key, name text, note text, active boolean)")
        .await;
    let expected = [
        (
            "jsonl",
            "{\"id\":1,\"name\":\"Ada, L.\",\"note\":\"said \\\"hi\\\"\",\"active\":true}\n{\"id\":2,\"name\":\"Bo\",\"note\":null,\"active\":false}\n{\"id\":3,\"name\":\"Cy\",\"note\":\"\",\"active\":true}\n",
        ),
        (
            "json",
            "[{\"id\":1,\"name\":\"Ada, L.\",\"note\":\"said \\\"hi\\\"\",\"active\":true},{\"id\":2,\"name\":\"Bo\",\"note\":null,\"active\":false},{\"id\":3,\"name\":\"Cy\",\"note\":\"\",\"active\":true}]",
        ),
        (
            "csv",
            "id,name,note,active\n1,\"Ada, L.\",\"said \"\"hi\"\"\",true\n2,Bo,,false\n3,Cy,,true\n",
        ),
    ];
    for (ext, contents) in expected {
        let url = format!("s3://exports/people/all.{ext}");
        let o = transfer(
            json!({
                "source": {"tool": "postgres", "auth": "pg_local", "query": PEOPLE.replace("$S", &s.name)},
                "target": {"tool": "s3", "url": url, "auth": "s3_main"}
            }),
            &[("source", pg_cred()), ("target", s3_cred(&s3))],
        )
        .await;
        assert!(o.is_ok(), "{ext}: {:?}", o.error);
        assert_eq!(o.result["rows_written"], 3);
        assert_eq!(o.result["batches"], 1);
        assert_eq!(o.result["target_url"], url);
        assert_eq!(o.result["target_format"], ext);
        assert_eq!(o.result["direction"], "postgres_to_s3");
        let stored =
            std::fs::read_to_string(s3.dir().join(format!("exports/people/all.{ext}"))).unwrap();
        assert_eq!(stored, contents, "{ext}");

        // And back into PostgreSQL, replacing what the table held.
        let o = transfer(
            json!({
                "source": {"type": "s3", "url": url, "auth": "s3_main"},
                "target": {"type": "postgres", "auth": "pg_local", "table": format!("{}.back", s.name)},
                "mode": "replace"
            }),
            &[("source", s3_cred(&s3)), ("target", pg_cred())],
        )
        .await;
        assert!(o.is_ok(), "{ext}: {:?}", o.error);
        assert_eq!(
            (
                o.result["rows_read"].clone(),
                o.result["source_url"].clone()
            ),
            (json!(3), json!(url))
        );
        let back = s
            .sql("select id, name, note, active from $S.back order by id")
            .await["rows"]
            .clone();
        if ext == "csv" {
            // CSV has no null apart from an empty field: '' comes back null.
            let mut want = people.clone();
            want[2]["note"] = Value::Null;
            assert_eq!(back, want, "{ext}");
        } else {
            assert_eq!(back, people, "{ext}");
        }
    }
    s.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_are_read_from_and_written_to_gs_objects() {
    let gcs = GcsEmulator::start();
    // gcp-storage-emulator routes no percent-encoded bucket name, and
    // object_store encodes `-`: a bucket name of letters.
    gcs.put(
        "rows",
        "in/users.ndjson",
        "{\"id\": 1, \"user\": {\"name\": \"ada\"}}\n{\"id\": 2, \"user\": {\"name\": \"bo\"}}\n",
    )
    .await;
    let s = schema().await;
    s.sql("create table $S.users (id int primary key, name text)")
        .await;
    let o = transfer(
        json!({
            "source": {"tool": "gcs", "url": "gs://rows/in/users.ndjson", "auth": "gcs_main"},
            "target": {"tool": "postgres", "auth": "pg_local", "table": format!("{}.users", s.name),
                       "mapping": {"id": "id", "name": "user.name"}},
            "mode": "upsert"
        }),
        &[("source", gcs_cred(&gcs)), ("target", pg_cred())],
    )
    .await;
    assert!(o.is_ok(), "{:?}", o.error);
    assert_eq!(o.result["direction"], "gcs_to_postgres");
    assert_eq!(
        s.sql("select id, name from $S.users order by id").await["rows"],
        json!([{"id": 1, "name": "ada"}, {"id": 2, "name": "bo"}])
    );

    let o = transfer(
        json!({
            "source": {"tool": "postgres", "auth": "pg_local",
                       "query": format!("select id, upper(name) as name from {}.users order by id", s.name)},
            "target": {"tool": "gcs", "url": "gs://rows/out/users", "format": "csv", "auth": "gcs_main"}
        }),
        &[("source", pg_cred()), ("target", gcs_cred(&gcs))],
    )
    .await;
    assert!(o.is_ok(), "{:?}", o.error);
    let cred = gcs.credential();
    let stored =
        noetl_mesh::remote::read_object("gs://rows/out/users", Some(&cred), None, None, 1 << 20)
            .await
            .unwrap();
    assert_eq!(String::from_utf8(stored).unwrap(), "id,name\n1,ADA\n2,BO\n");
    s.drop_now().await;
}

#[tokio::test]
async fn wrong_sides_and_missing_objects_fail_naming_the_field_or_the_url() {
    let s3 = S3Server::start("exports");
    // A target of the wrong store: refused before anything runs.
    let o = transfer(
        json!({
            "source": {"tool": "s3", "url": "s3://exports/a.jsonl"},
            "target": {"tool": "s3", "url": "gs://exports/b.jsonl"}
        }),
        &[],
    )
    .await;
    let e = o.error.unwrap();
    assert_eq!(e.kind, "transfer.config");
    assert_eq!(
        e.message,
        "transfer task \"xfer\" of step \"load\": `target.url` \"gs://exports/b.jsonl\" is not an object of target `s3`: write s3://bucket/key"
    );
    let o = transfer(
        json!({
            "source": {"tool": "postgres", "query": "select 1 as a"},
            "target": {"tool": "gcs", "url": "gs://b/x.csv"},
            "mode": "upsert"
        }),
        &[],
    )
    .await;
    let e = o.error.unwrap();
    assert_eq!(e.kind, "transfer.config");
    assert!(
        e.message
            .contains("`mode` upsert cannot merge rows into an object"),
        "{}",
        e.message
    );

    // A missing object: the store's answer and the URL, no credential.
    let o = transfer(
        json!({
            "source": {"tool": "s3", "url": "s3://exports/gone.csv", "auth": "s3_main"},
            "target": {"tool": "postgres", "table": "t"}
        }),
        &[("source", s3_cred(&s3))],
    )
    .await;
    let e = o.error.clone().unwrap();
    assert_eq!(e.kind, "transfer.object");
    assert!(
        e.message.contains("s3://exports/gone.csv: no such object"),
        "{}",
        e.message
    );
    assert_eq!(o.helpers["transfer"]["stage"], "source");

    // A wrong secret key: refused by the store, the key never shown.
    let mut bad = s3_cred(&s3);
    bad.data["secret_access_key"] = json!(format!("{SECRET_KEY}-wrong"));
    std::fs::write(s3.dir().join("exports/rows.jsonl"), "{\"a\": 1}\n").unwrap();
    let o = transfer(
        json!({
            "source": {"tool": "s3", "url": "s3://exports/rows.jsonl", "auth": "s3_main"},
            "target": {"tool": "postgres", "table": "t"}
        }),
        &[("source", bad)],
    )
    .await;
    let e = o.error.unwrap();
    assert_eq!(e.kind, "transfer.object");
    assert!(
        e.message.contains("s3://exports/rows.jsonl"),
        "{}",
        e.message
    );

    // An object that is not what its format says: where, not what.
    std::fs::write(s3.dir().join("exports/bad.jsonl"), "{\"a\": 1}\nnot json\n").unwrap();
    let o = transfer(
        json!({
            "source": {"tool": "s3", "url": "s3://exports/bad.jsonl", "auth": "s3_main"},
            "target": {"tool": "postgres", "table": "t"}
        }),
        &[("source", s3_cred(&s3))],
    )
    .await;
    let e = o.error.unwrap();
    assert_eq!(e.kind, "transfer.source");
    assert!(
        e.message
            .contains("source s3://exports/bad.jsonl: line 2 is not JSON"),
        "{}",
        e.message
    );
}
