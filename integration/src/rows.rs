//! The mix's PostgreSQL side effects (the `rows` and `cursor` cases): each
//! iteration upserts one row keyed by execution, step and iteration (or
//! the queue row it drained) in the machine's PostgreSQL, counting its
//! attempts, so the checks can require each key exactly once and count the
//! attempts a crash repeated; the `cursor` case drains its own rows of a
//! work queue.

use std::collections::BTreeMap;

/// The database the rows go to (the machine's PostgreSQL, trust auth).
pub const CONNECTION: &str = "host=127.0.0.1 port=5432 user=postgres dbname=test";

/// The table: `(execution_id, step, idx)` is its key, `attempts` counts
/// the upserts of a key.
pub const TABLE: &str = "noetl_mix_rows";

/// The work queue the mix's cursor loop drains (the `cursor` case):
/// `(execution_id, id)` is its key; each execution fills its own rows.
pub const QUEUE: &str = "noetl_mix_queue";

/// The keychain entry the `cursor` case connects with.
pub const CREDENTIAL: &str = "mix_db";

/// Store [`CREDENTIAL`] (the machine's PostgreSQL) in the mesh's vault:
/// every run that drives the mix does, before it submits.
/// A write refused for now (a cluster that has just created the bucket's
/// stream may not route to it yet: "no stream found for given subject")
/// is tried again for up to 10 s, as a service would.
pub async fn register_credential(mesh: &noetl_mesh::Mesh) {
    let credential = noetl_mesh::credentials::Credential {
        name: CREDENTIAL.into(),
        kind: "postgres_credential".into(),
        data: serde_json::json!({"host": "127.0.0.1", "port": 5432, "user": "postgres",
                                 "password": "mix-pw-never-shown", "database": "test"}),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match mesh.vault().put(&credential).await {
            Ok(_) => return,
            Err(e) if e.kind().is_retryable() && std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => panic!("store the mix's credential: {e:?}"),
        }
    }
}

async fn client() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(CONNECTION, tokio_postgres::NoTls)
        .await
        .expect("the machine's PostgreSQL on 127.0.0.1:5432");
    tokio::spawn(conn);
    client
}

/// Create the tables if they are not there (once, before any execution of
/// the mix writes to them: concurrent `CREATE TABLE IF NOT EXISTS` can
/// collide).
pub async fn prepare() {
    client()
        .await
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {TABLE} (execution_id text NOT NULL, step text NOT NULL, \
             idx integer NOT NULL, attempts integer NOT NULL DEFAULT 1, \
             PRIMARY KEY (execution_id, step, idx)); \
             CREATE TABLE IF NOT EXISTS {QUEUE} (execution_id text NOT NULL, id integer NOT NULL, \
             status text NOT NULL DEFAULT 'pending', claimed_by text, \
             PRIMARY KEY (execution_id, id))"
        ))
        .await
        .expect("create the mix's rows and queue tables");
}

/// The rows of execution `eid`: `<step>/<idx>` → attempts.
pub async fn of(eid: &str) -> BTreeMap<String, u32> {
    let rows = client()
        .await
        .query(
            &format!("SELECT step, idx, attempts FROM {TABLE} WHERE execution_id = $1"),
            &[&eid],
        )
        .await
        .expect("read the mix's rows");
    rows.iter()
        .map(|r| {
            let (step, idx, attempts): (String, i32, i32) = (r.get(0), r.get(1), r.get(2));
            (format!("{step}/{idx}"), attempts.max(0) as u32)
        })
        .collect()
}
