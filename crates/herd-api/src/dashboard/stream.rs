//! `GET /events/stream`: server-sent events. The first event (`snapshot`) carries the history,
//! the events and the status; then a `sample` every second and an `event` as each happens.
//! `GET /dashboard/snapshot` answers the first event's document alone (scripts, tests).

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::IntoResponse;
use axum::routing::{get, MethodRouter};
use herd_core::ClusterStatus;
use tokio::sync::{broadcast, watch};

use super::Dashboard;

/// The routes of the stream and of the snapshot.
pub fn stream_route<S: Clone + Send + Sync + 'static>(
    dashboard: Dashboard,
    status: watch::Receiver<ClusterStatus>,
) -> (MethodRouter<S>, MethodRouter<S>) {
    let (d1, s1) = (dashboard.clone(), status.clone());
    let stream = get(move || {
        let (dashboard, status) = (d1.clone(), s1.clone());
        async move { sse(dashboard, status) }
    });
    let snapshot = get(move || {
        let text = dashboard.snapshot_json(&status.borrow().clone());
        async move {
            (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                text,
            )
        }
    });
    (stream, snapshot)
}

fn sse(dashboard: Dashboard, status: watch::Receiver<ClusterStatus>) -> impl IntoResponse {
    // Subscribed before the snapshot is taken: nothing falls between the two.
    let rx = dashboard.subscribe();
    let closing = dashboard.closing();
    let first = dashboard.snapshot_json(&status.borrow().clone());
    let state = (Some(first), rx, closing);
    let events = futures_util::stream::unfold(state, |(first, mut rx, mut closing)| async move {
        if let Some(text) = first {
            let event = Event::default().event("snapshot").data(text);
            return Some((Ok::<_, Infallible>(event), (None, rx, closing)));
        }
        loop {
            if *closing.borrow() {
                return None;
            }
            let received = tokio::select! {
                r = rx.recv() => r,
                _ = closing.changed() => return None,
            };
            match received {
                Ok(frame) => {
                    let event = Event::default().event(frame.kind).data(&*frame.data);
                    return Some((Ok(event), (None, rx, closing)));
                }
                // A slow viewer missed frames: it carries on from the newest.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
