//! The mix's PostgreSQL side effect (the `rows` case): each iteration
//! upserts one row keyed by execution, step and iteration in the machine's
//! PostgreSQL, counting its attempts, so the checks can require each key
//! exactly once and count the attempts a crash repeated.

use std::collections::BTreeMap;

/// The database the rows go to (the machine's PostgreSQL, trust auth).
pub const CONNECTION: &str = "host=127.0.0.1 port=5432 user=postgres dbname=test";

/// The table: `(execution_id, step, idx)` is its key, `attempts` counts
/// the upserts of a key.
pub const TABLE: &str = "noetl_mix_rows";

async fn client() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(CONNECTION, tokio_postgres::NoTls)
        .await
        .expect("the machine's PostgreSQL on 127.0.0.1:5432");
    tokio::spawn(conn);
    client
}

/// Create the table if it is not there (once, before any execution of the
/// mix writes to it: concurrent `CREATE TABLE IF NOT EXISTS` can collide).
pub async fn prepare() {
    client()
        .await
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {TABLE} (execution_id text NOT NULL, step text NOT NULL, \
             idx integer NOT NULL, attempts integer NOT NULL DEFAULT 1, \
             PRIMARY KEY (execution_id, step, idx))"
        ))
        .await
        .expect("create the mix's rows table");
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
