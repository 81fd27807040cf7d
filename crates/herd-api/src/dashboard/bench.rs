//! The latest `herd bench` reports in a configured results directory (`dashboard.bench_results`):
//! each report (`report.md`) with its SVG charts, found in the directory itself and in its
//! sub-directories (`herd bench all` writes one per scenario), newest first.
//!
//! `GET /bench` lists them as JSON; `GET /bench/file?path=…` serves one of their SVG files,
//! only when the path stays inside the directory.

use std::path::{Component, Path, PathBuf};
use std::time::UNIX_EPOCH;

use axum::extract::Query;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use serde::Serialize;

/// Reports shown at most.
const REPORTS: usize = 12;
/// Largest report text read (a report is a page of Markdown).
const MAX_REPORT_BYTES: u64 = 256 * 1024;

/// One report.
#[derive(Debug, PartialEq, Serialize)]
pub struct Report {
    /// Its directory, relative to the results directory (`""` for the directory itself).
    pub name: String,
    /// When `report.md` was last written, in Unix milliseconds.
    pub modified_ms: u64,
    /// The Markdown text.
    pub markdown: String,
    /// Its SVG charts, relative to the results directory.
    pub charts: Vec<String>,
}

/// The reports under `root`, newest first (at most [`REPORTS`]); unreadable entries are skipped.
pub fn reports(root: &Path) -> Vec<Report> {
    let mut dirs = vec![PathBuf::new()];
    if let Ok(entries) = std::fs::read_dir(root) {
        let mut subs: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| PathBuf::from(e.file_name()))
            .collect();
        subs.sort();
        dirs.extend(subs);
    }
    let mut found: Vec<Report> = dirs.iter().filter_map(|d| report(root, d)).collect();
    found.sort_by_key(|r| std::cmp::Reverse(r.modified_ms));
    found.truncate(REPORTS);
    found
}

fn report(root: &Path, dir: &Path) -> Option<Report> {
    let file = root.join(dir).join("report.md");
    let meta = std::fs::metadata(&file).ok()?;
    if meta.len() > MAX_REPORT_BYTES {
        return None;
    }
    let markdown = std::fs::read_to_string(&file).ok()?;
    let modified_ms = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64);
    let mut charts: Vec<String> = std::fs::read_dir(root.join(dir))
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".svg"))
        .map(|n| dir.join(n).to_string_lossy().into_owned())
        .collect();
    charts.sort();
    Some(Report {
        name: dir.to_string_lossy().into_owned(),
        modified_ms,
        markdown,
        charts,
    })
}

/// `path` as a relative path inside the results directory naming an SVG file, or `None` when
/// it could leave it (absolute, `..`) or names anything else.
pub fn safe_chart_path(path: &str) -> Option<PathBuf> {
    let p = Path::new(path);
    let inside = p
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    (inside && !path.is_empty() && path.ends_with(".svg")).then(|| p.to_path_buf())
}

#[derive(serde::Deserialize)]
struct FileQuery {
    path: String,
}

/// The routes `/bench` and `/bench/file` over `root` (none configured: empty list, 404).
pub fn routes<S: Clone + Send + Sync + 'static>(
    root: Option<PathBuf>,
) -> (MethodRouter<S>, MethodRouter<S>) {
    let r1 = root.clone();
    let list = get(move || {
        let root = r1.clone();
        async move {
            let found = match root {
                // Directory reads are blocking; they are few and small.
                Some(r) => tokio::task::spawn_blocking(move || reports(&r))
                    .await
                    .unwrap_or_default(),
                None => Vec::new(),
            };
            axum::Json(found)
        }
    });
    let file = get(move |Query(q): Query<FileQuery>| {
        let root = root.clone();
        async move { chart(root, &q.path).await }
    });
    (list, file)
}

async fn chart(root: Option<PathBuf>, path: &str) -> Response {
    let (Some(root), Some(rel)) = (root, safe_chart_path(path)) else {
        return (StatusCode::NOT_FOUND, "no such chart\n").into_response();
    };
    match tokio::fs::read(root.join(rel)).await {
        Ok(bytes) => (
            [
                (header::CONTENT_TYPE, "image/svg+xml"),
                // Shown through <img>: scripts in an SVG do not run there; this also stops them
                // if the file is opened directly.
                (header::CONTENT_SECURITY_POLICY, "script-src 'none'"),
            ],
            bytes,
        )
            .into_response(),
        Err(_) => (StatusCode::NOT_FOUND, "no such chart\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_paths_stay_inside() {
        for (path, ok) in [
            ("proxy.svg", true),
            ("proxy/proxy.svg", true),
            ("./lag/lag.svg", true),
            ("../x.svg", false),
            ("a/../../x.svg", false),
            ("/etc/x.svg", false),
            ("report.md", false),
            ("results.json", false),
            ("", false),
        ] {
            assert_eq!(safe_chart_path(path).is_some(), ok, "{path}");
        }
    }

    #[test]
    fn finds_reports_newest_first() {
        let tmp = std::env::temp_dir().join(format!("herd-bench-reports-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        for (dir, chart) in [("lag", "lag.svg"), ("proxy", "proxy.svg")] {
            std::fs::create_dir_all(tmp.join(dir)).expect("dir");
            std::fs::write(tmp.join(dir).join("report.md"), format!("# {dir}\n")).expect("md");
            std::fs::write(tmp.join(dir).join(chart), "<svg/>").expect("svg");
            // Distinct modification times.
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::fs::create_dir_all(tmp.join("empty")).expect("dir");
        let found = reports(&tmp);
        let names: Vec<&str> = found.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["proxy", "lag"]);
        assert_eq!(found[0].charts, ["proxy/proxy.svg"]);
        assert_eq!(found[0].markdown, "# proxy\n");
        assert!(reports(&tmp.join("missing")).is_empty());
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
