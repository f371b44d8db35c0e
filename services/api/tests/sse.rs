//! Server-Sent Events over real HTTP: an execution's follow stream ends
//! with `execution.completed`, a reconnect with `Last-Event-ID` resumes
//! after that sequence, a stream without `follow` ends with what is
//! stored, and the whole mesh's stream sees new executions.

use std::time::Duration;

use serde_json::json;

mod support;
use support::{read_sse, Api, FLOW, SLOW};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follow_stream_ends_with_completion_and_resumes_after_the_last_event_id() {
    let (api, keys) = Api::start().await;
    let (admin, viewer) = (Some(keys.admin.as_str()), keys.viewer.as_str());
    api.register(admin, SLOW).await;
    let id = api
        .execute(admin, "tests/api_slow", json!({"seconds": 1}))
        .await;

    // Following from the start: every event up to the terminal one, then
    // the stream ends by itself.
    let url = format!("{}/api/executions/{id}/events?follow=true", api.base);
    let r = api.http.get(&url).bearer_auth(viewer).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let all = read_sse(r, Duration::from_secs(30)).await;
    let last = all.last().expect("events");
    assert_eq!(last.event, "execution.completed", "{all:?}");
    assert_eq!(last.data["execution_id"], id.as_str());
    assert_eq!(last.data["seq"], last.id);
    // The router's first event (the start's audit event may come first).
    let first = all.iter().find(|e| e.event != "audit").unwrap();
    assert_eq!(first.event, "playbook.initialized");
    let ids: Vec<u64> = all.iter().filter(|e| e.resumable).map(|e| e.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    assert!(all.iter().all(|e| e.data["execution_id"] == id.as_str()));
    // An event sent without an `id:` is stored together with the one
    // after it, which has its sequence: a `task.done` inside its step's
    // end, or the token or answer that carries a `step.started`.
    let carried: Vec<usize> = (0..all.len()).filter(|i| !all[*i].resumable).collect();
    assert!(!carried.is_empty(), "{all:?}");
    for i in carried {
        let pair = (all[i].event.as_str(), all[i + 1].event.as_str());
        assert!(
            matches!(
                pair,
                ("task.done", "step.done") | ("token.created" | "next.selected", "step.started")
            ),
            "{pair:?}"
        );
        assert_eq!((all[i + 1].id, all[i + 1].resumable), (all[i].id, true));
    }
    assert!(
        all.iter().any(|e| e.event == "task.done" && !e.resumable),
        "a task.done carried in its end: {all:?}"
    );

    // Reconnecting after the third event: exactly the ones after it.
    let resume_at = ids[2];
    let r = api
        .http
        .get(&url)
        .bearer_auth(viewer)
        .header("Last-Event-ID", resume_at.to_string())
        .send()
        .await
        .unwrap();
    let rest = read_sse(r, Duration::from_secs(10)).await;
    let rest_ids: Vec<u64> = rest.iter().map(|e| e.id).collect();
    let after: Vec<u64> = all
        .iter()
        .map(|e| e.id)
        .filter(|s| *s > resume_at)
        .collect();
    assert_eq!(rest_ids, after, "resumed after {resume_at}");
    // After the terminal event of an execution that ended: nothing, and
    // the stream ends instead of waiting.
    let r = api
        .http
        .get(&url)
        .bearer_auth(viewer)
        .header("Last-Event-ID", last.id.to_string())
        .send()
        .await
        .unwrap();
    assert!(read_sse(r, Duration::from_secs(10)).await.is_empty());

    // Without follow: what is stored, then the end; `after` and `type`
    // narrow it.
    let r = api
        .http
        .get(format!(
            "{}/api/executions/{id}/events?type=step.*",
            api.base
        ))
        .bearer_auth(viewer)
        .send()
        .await
        .unwrap();
    let steps = read_sse(r, Duration::from_secs(10)).await;
    let kinds: Vec<&str> = steps.iter().map(|e| e.event.as_str()).collect();
    assert!(
        !kinds.is_empty() && kinds.iter().all(|k| k.starts_with("step.")),
        "{kinds:?}"
    );
    // Following with a type filter: those types only, and it still ends
    // once the execution has.
    let r = api
        .http
        .get(format!(
            "{}/api/executions/{id}/events?type=step.*&follow=true",
            api.base
        ))
        .bearer_auth(viewer)
        .send()
        .await
        .unwrap();
    let followed = read_sse(r, Duration::from_secs(10)).await;
    let followed: Vec<u64> = followed.iter().map(|e| e.id).collect();
    assert_eq!(followed, steps.iter().map(|e| e.id).collect::<Vec<_>>());
    let r = api
        .http
        .get(format!(
            "{}/api/executions/{id}/events?after={}",
            api.base,
            ids[ids.len() - 2]
        ))
        .bearer_auth(viewer)
        .send()
        .await
        .unwrap();
    let tail = read_sse(r, Duration::from_secs(10)).await;
    assert_eq!(tail.iter().map(|e| e.id).collect::<Vec<_>>(), [last.id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_mesh_stream_follows_new_executions_and_pages_stored_ones() {
    let (api, keys) = Api::start().await;
    let (admin, viewer) = (Some(keys.admin.as_str()), keys.viewer.as_str());
    api.register(admin, FLOW).await;
    let first = api.execute(admin, "tests/api_flow", json!({})).await;
    api.wait_status(&first, admin, "COMPLETED").await;

    // Following the whole mesh from now on: the next execution's events
    // (and none of the first one's) as they come.
    let r = api
        .http
        .get(format!(
            "{}/api/events?follow=true&type=execution.*&limit=1",
            api.base
        ))
        .bearer_auth(viewer)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let reader = tokio::spawn(read_sse(r, Duration::from_secs(30)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = api.execute(admin, "tests/api_flow", json!({})).await;
    let seen = reader.await.unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].event, "execution.completed");
    assert_eq!(seen[0].data["execution_id"], second.as_str());

    // Without follow: the stored events in pages of at most `limit`,
    // resumed with `after` = the last `id:`; a page ends before a stored
    // message whose events would pass the limit, so the pages together
    // are every event once.
    let read = |query: String| {
        let url = format!("{}/api/events?{query}", api.base);
        let req = api.http.get(url).bearer_auth(viewer);
        async move { read_sse(req.send().await.unwrap(), Duration::from_secs(10)).await }
    };
    let everything = read("limit=10000".into()).await;
    let (mut paged, mut after) = (Vec::new(), 0);
    loop {
        let page = read(format!("limit=5&after={after}")).await;
        let Some(last) = page.last() else { break };
        assert!(page.len() <= 5, "{page:?}");
        assert!(last.resumable, "a page ends with a whole stored message");
        after = last.id;
        paged.extend(page);
    }
    let key = |e: &support::Sse| (e.id, e.event.clone());
    assert_eq!(
        paged.iter().map(key).collect::<Vec<_>>(),
        everything.iter().map(key).collect::<Vec<_>>()
    );
    let executions: std::collections::BTreeSet<String> = everything
        .iter()
        .map(|e| e.data["execution_id"].as_str().unwrap().to_string())
        .collect();
    assert!(executions.contains(&first));

    // `limit=0` is an empty page, as `/api/ehdb/...?limit=0` is `[]`.
    assert!(read("limit=0".into()).await.is_empty());
    let one = format!("/api/executions/{first}/events?limit=0");
    assert!(read_sse(
        api.http
            .get(format!("{}{one}", api.base))
            .bearer_auth(viewer)
            .send()
            .await
            .unwrap(),
        Duration::from_secs(10)
    )
    .await
    .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_ends_open_streams_and_stops_the_api() {
    let (api, keys) = Api::start().await;
    let viewer = keys.viewer.as_str();
    let r = api
        .http
        .get(format!("{}/api/events?follow=true", api.base))
        .bearer_auth(viewer)
        .send()
        .await
        .unwrap();
    let reader = tokio::spawn(read_sse(r, Duration::from_secs(30)));
    tokio::time::sleep(Duration::from_millis(200)).await;
    api.shutdown.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(10), api.served)
        .await
        .expect("the API drains within its grace")
        .unwrap();
    assert!(stopped.is_ok(), "{stopped:?}");
    assert!(reader.await.unwrap().is_empty());
    assert!(
        reqwest::get(format!("{}/health", api.base)).await.is_err(),
        "nothing listens after the drain"
    );
}

/// A parallel loop whose window goes out in batches of four.
const BATCHED: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: api_batched
  path: tests/api_batched
workflow:
  - step: start
    loop:
      in: "{{ range(12) | list }}"
      iterator: i
      spec:
        mode: parallel
        max_in_flight: 16
    tool:
      - name: touch
        kind: noop
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_type_that_names_a_batch_streams_its_iterations() {
    let (api, keys) = Api::start().await;
    let (admin, viewer) = (Some(keys.admin.as_str()), keys.viewer.as_str());
    api.register(admin, BATCHED).await;
    let id = api.execute(admin, "tests/api_batched", json!({})).await;
    api.wait_status(&id, admin, "COMPLETED").await;
    let read = |filter: &'static str| {
        let url = format!("{}/api/executions/{id}/events?type={filter}", api.base);
        let req = api.http.get(url).bearer_auth(viewer);
        async move { read_sse(req.send().await.unwrap(), Duration::from_secs(10)).await }
    };
    // Stored as batches, streamed as each iteration's end (and the task's
    // end it carries), every field restored.
    let batches = read("batch.completed").await;
    let ends: Vec<_> = batches
        .iter()
        .filter(|e| e.event == "loop.iteration.done")
        .collect();
    assert_eq!(ends.len(), 12, "{batches:?}");
    let mut indices: Vec<u64> = ends
        .iter()
        .map(|e| e.data["payload"]["index"].as_u64().unwrap())
        .collect();
    indices.sort();
    assert_eq!(indices, (0..12).collect::<Vec<_>>());
    for e in &ends {
        assert_eq!(e.data["payload"]["status"], "ok", "{e:?}");
        assert!(e.data["payload"]["loop_run_id"].is_string(), "{e:?}");
    }
    let tasks = batches.iter().filter(|e| e.event == "task.done").count();
    assert_eq!(tasks, 12, "{batches:?}");
    // The iterations' own type finds the same ends.
    let by_type = read("loop.iteration.done").await;
    assert_eq!(by_type.len(), 12, "{by_type:?}");
    // And their starts, stored as `batch.accepted`.
    assert_eq!(read("loop.iteration.started").await.len(), 12);
    assert!(read("batch.accepted")
        .await
        .iter()
        .all(|e| e.event == "loop.iteration.started"));
}
