//! Executions as NoETL lists them: one line per header, the filters and
//! paging of `GET /api/executions`.

use noetl_mesh::state::{ExecHeader, ExecStatus};

use crate::contract::executions::{ExecutionSummary, ListExecutionsQuery};
use crate::error::ApiError;
use crate::shape::catalog::parse_catalog_id;
use crate::shape::status::{parse_status, status_name};

/// Page size without `limit`.
pub const DEFAULT_LIMIT: u32 = 50;
/// Largest page.
pub const MAX_LIMIT: u32 = 100;

/// The catalog id and path an execution's source names, when it came
/// from the catalog (`<path>@v<N>`).
pub fn catalog_source(source: &str) -> (Option<String>, Option<String>) {
    match parse_catalog_id(source) {
        Some((path, _)) => (Some(source.to_string()), Some(path)),
        None => (None, None),
    }
}

/// One line of the list.
pub fn summary(h: &ExecHeader) -> ExecutionSummary {
    let (catalog_id, path) = catalog_source(&h.source);
    ExecutionSummary {
        execution_id: h.execution_id.clone(),
        catalog_id,
        path,
        status: status_name(h.status).into(),
        is_paused: false,
        is_queued: false,
        started_at: h.started_at.clone(),
        completed_at: h.ended_at.clone(),
        playbook: h.playbook.clone(),
        parent_execution_id: Some(h.parent_execution_id.clone()).filter(|p| !p.is_empty()),
        error: h.error.clone(),
    }
}

/// A list query, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Filter {
    /// Only this status.
    pub status: Option<ExecStatus>,
    /// Only paths containing this (lower case).
    pub path: Option<String>,
    /// Only this catalog id.
    pub catalog_id: Option<String>,
    /// Only playbook names or paths containing this (lower case).
    pub playbook: Option<String>,
    /// Page size (1..=[`MAX_LIMIT`]; 0 is an empty page).
    pub limit: usize,
    /// Skipped first.
    pub offset: usize,
}

/// Check a list query: a status that is not one is 422; `limit` is capped
/// at [`MAX_LIMIT`] (as NoETL does).
pub fn filter(q: &ListExecutionsQuery) -> Result<Filter, ApiError> {
    let status = q
        .status
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(parse_status)
        .transpose()
        .map_err(ApiError::invalid)?;
    Ok(Filter {
        status,
        path: lower(q.path.as_ref()),
        catalog_id: q.catalog_id.clone().filter(|c| !c.is_empty()),
        playbook: lower(q.playbook.as_ref()),
        limit: q.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT) as usize,
        offset: q.offset.unwrap_or(0) as usize,
    })
}

/// A text filter in lower case (`None` when empty).
fn lower(text: Option<&String>) -> Option<String> {
    text.map(|t| t.trim().to_lowercase())
        .filter(|t| !t.is_empty())
}

/// Whether `h` passes the text filters of `f`.
fn matches_text(h: &ExecHeader, f: &Filter) -> bool {
    let (id, path) = catalog_source(&h.source);
    let path = path.map(|p| p.to_lowercase());
    let path_ok = f
        .path
        .as_ref()
        .is_none_or(|want| path.as_ref().is_some_and(|p| p.contains(want.as_str())));
    let playbook_ok = f.playbook.as_ref().is_none_or(|want| {
        h.playbook.to_lowercase().contains(want.as_str())
            || path.as_ref().is_some_and(|p| p.contains(want.as_str()))
    });
    path_ok
        && playbook_ok
        && f.catalog_id
            .as_ref()
            .is_none_or(|want| id.as_ref() == Some(want))
}

/// The page `f` selects of `headers`: filtered, newest first, offset, limit.
pub fn select(headers: &[ExecHeader], f: &Filter) -> Vec<ExecutionSummary> {
    let mut kept: Vec<&ExecHeader> = headers
        .iter()
        .filter(|h| f.status.is_none_or(|s| h.status == s))
        .filter(|h| matches_text(h, f))
        .collect();
    // Newest first (RFC 3339 times in UTC sort as text); ties by id.
    kept.sort_by(|a, b| {
        b.started_at
            .cmp(&a.started_at)
            .then(a.execution_id.cmp(&b.execution_id))
    });
    kept.into_iter()
        .skip(f.offset)
        .take(f.limit)
        .map(summary)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(id: &str, status: ExecStatus, source: &str, started: &str) -> ExecHeader {
        ExecHeader {
            status,
            source: source.into(),
            started_at: started.into(),
            playbook: "p".into(),
            ..ExecHeader::running(id, Vec::new())
        }
    }

    fn all() -> Vec<ExecHeader> {
        vec![
            header(
                "a",
                ExecStatus::Completed,
                "flows/load@v1",
                "2026-01-01T00:00:01.000Z",
            ),
            header(
                "b",
                ExecStatus::Failed,
                "flows/load@v2",
                "2026-01-01T00:00:02.000Z",
            ),
            header(
                "c",
                ExecStatus::Running,
                "other/job@v1",
                "2026-01-01T00:00:03.000Z",
            ),
            header(
                "d",
                ExecStatus::Completed,
                "hello.yaml",
                "2026-01-01T00:00:04.000Z",
            ),
        ]
    }

    fn ids(rows: &[ExecutionSummary]) -> Vec<&str> {
        rows.iter().map(|r| r.execution_id.as_str()).collect()
    }

    fn query(f: impl FnOnce(&mut ListExecutionsQuery)) -> Filter {
        let mut q = ListExecutionsQuery::default();
        f(&mut q);
        filter(&q).unwrap()
    }

    #[test]
    fn newest_first_with_offset_and_limit() {
        let rows = select(&all(), &query(|_| {}));
        assert_eq!(ids(&rows), ["d", "c", "b", "a"]);
        let page = select(
            &all(),
            &query(|q| {
                q.limit = Some(2);
                q.offset = Some(1);
            }),
        );
        assert_eq!(ids(&page), ["c", "b"]);
        assert_eq!(query(|q| q.limit = Some(1000)).limit, MAX_LIMIT as usize);
        assert_eq!(query(|_| {}).limit, DEFAULT_LIMIT as usize);
    }

    #[test]
    fn filters_by_status_path_and_catalog_id() {
        let done = select(&all(), &query(|q| q.status = Some("completed".into())));
        assert_eq!(ids(&done), ["d", "a"]);
        let flows = select(&all(), &query(|q| q.path = Some("FLOWS/".into())));
        assert_eq!(ids(&flows), ["b", "a"]);
        let v2 = select(
            &all(),
            &query(|q| q.catalog_id = Some("flows/load@v2".into())),
        );
        assert_eq!(ids(&v2), ["b"]);
        let e = filter(&ListExecutionsQuery {
            status: Some("finished".into()),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(e.status().as_u16(), 422);
    }

    #[test]
    fn the_playbook_filter_matches_the_name_or_the_path_in_any_case() {
        let mut headers = all();
        headers[3].playbook = "Nightly-Load".into();
        let by_name = select(&headers, &query(|q| q.playbook = Some("nightly".into())));
        assert_eq!(ids(&by_name), ["d"]);
        let by_path = select(&headers, &query(|q| q.playbook = Some(" Other/ ".into())));
        assert_eq!(ids(&by_path), ["c"]);
        let none = select(&headers, &query(|q| q.playbook = Some("absent".into())));
        assert!(none.is_empty());
    }

    #[test]
    fn a_line_names_its_catalog_version_when_it_has_one() {
        let rows = select(&all(), &query(|_| {}));
        assert_eq!(rows[2].catalog_id.as_deref(), Some("flows/load@v2"));
        assert_eq!(rows[2].path.as_deref(), Some("flows/load"));
        assert_eq!(rows[2].status, "FAILED");
        assert_eq!(rows[0].catalog_id, None, "an inline playbook");
    }
}
