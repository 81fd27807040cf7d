//! The live dashboard: a page at `/` (HTML, JavaScript and CSS embedded in the binary), a
//! server-sent events stream at `/events/stream`, and the history a new viewer starts from.
//!
//! One sampler task per process builds a [`Point`] every second from the published status and
//! the `/metrics` text, keeps the last 15 minutes of them and the latest events in bounded
//! rings, and broadcasts each to the connected viewers. With no viewer connected nothing is
//! serialised; the proxy's hot path is untouched (its counters are only read).

mod assets;
pub mod bench;
pub mod prom;
mod ring;
pub mod sample;
mod stream;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use herd_core::{ClusterEvent, ClusterStatus, EventSink};
use serde::Serialize;
use tokio::sync::{broadcast, watch};

pub use assets::routes as asset_routes;
pub use ring::Ring;
pub use sample::{CommitWaits, Point};
pub use stream::stream_route;

use crate::MetricsSource;

/// Points kept: 15 minutes at one a second.
pub const HISTORY_POINTS: usize = 15 * 60;
/// Events kept for the timeline.
pub const EVENTS_KEPT: usize = 200;
/// How often a point is taken.
pub const SAMPLE_PERIOD: Duration = Duration::from_secs(1);

/// Samples the primary's committing backends by wait event (a query on the primary), when the
/// process can; `None` when it cannot right now.
pub type WaitsSource = Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<CommitWaits>> + Send>>
        + Send
        + Sync,
>;

/// One message to the viewers: its SSE event name and JSON text.
#[derive(Clone, Debug)]
pub struct Frame {
    /// `sample` or `event`.
    pub kind: &'static str,
    /// The JSON document.
    pub data: Arc<str>,
}

/// The dashboard's shared state: history, events, and the channel to the viewers.
#[derive(Clone)]
pub struct Dashboard {
    shared: Arc<Shared>,
}

struct Shared {
    points: Mutex<Ring<Point>>,
    events: Mutex<Ring<ClusterEvent>>,
    live: broadcast::Sender<Frame>,
    /// Turns true when the process stops: open streams end, so the server can shut down.
    closing: watch::Sender<bool>,
}

/// What a viewer receives first: the history, the events and the current status.
#[derive(Serialize)]
pub struct Snapshot<'a> {
    /// Oldest first.
    pub points: Vec<Point>,
    /// Oldest first.
    pub events: Vec<ClusterEvent>,
    /// The latest published status.
    pub status: &'a ClusterStatus,
}

#[derive(Serialize)]
struct Live<'a> {
    point: &'a Point,
    status: &'a ClusterStatus,
}

impl Default for Dashboard {
    fn default() -> Self {
        Dashboard {
            shared: Arc::new(Shared {
                points: Mutex::new(Ring::new(HISTORY_POINTS)),
                events: Mutex::new(Ring::new(EVENTS_KEPT)),
                live: broadcast::channel(64).0,
                closing: watch::channel(false).0,
            }),
        }
    }
}

impl Dashboard {
    /// Where supervisors report events: kept for the timeline, and sent to the viewers at once.
    pub fn event_sink(&self) -> EventSink {
        let me = self.clone();
        Arc::new(move |e| me.record_event(e))
    }

    /// Keeps `event` and sends it to the connected viewers.
    pub fn record_event(&self, event: ClusterEvent) {
        if self.shared.live.receiver_count() > 0 {
            if let Ok(json) = serde_json::to_string(&event) {
                let _ = self.shared.live.send(Frame {
                    kind: "event",
                    data: json.into(),
                });
            }
        }
        lock(&self.shared.events).push(event);
    }

    /// The history, events and `status` as one JSON document.
    pub fn snapshot_json(&self, status: &ClusterStatus) -> String {
        let snapshot = Snapshot {
            points: lock(&self.shared.points).iter().cloned().collect(),
            events: lock(&self.shared.events).iter().cloned().collect(),
            status,
        };
        serde_json::to_string(&snapshot).unwrap_or_else(|_| "{}".into())
    }

    /// A receiver of the live frames.
    pub fn subscribe(&self) -> broadcast::Receiver<Frame> {
        self.shared.live.subscribe()
    }

    /// Turns true when the streams must end.
    pub fn closing(&self) -> watch::Receiver<bool> {
        self.shared.closing.subscribe()
    }

    /// Ends every open stream (a server shutting down gracefully waits for its connections).
    pub fn close(&self) {
        self.shared.closing.send_replace(true);
    }

    /// Takes a point every [`SAMPLE_PERIOD`] until `shutdown` turns true.
    pub async fn run_sampler(
        self,
        status: watch::Receiver<ClusterStatus>,
        metrics: MetricsSource,
        waits: Option<WaitsSource>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut counters = sample::Counters::default();
        // Read-pool departures waiting for an explanation (see `sample::explain_left`).
        let mut held: Vec<ClusterEvent> = Vec::new();
        let mut tick = tokio::time::interval(SAMPLE_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => {}
            }
            if *shutdown.borrow() {
                self.close();
                return;
            }
            // The wait sample is a query on the primary: only taken while someone watches.
            let waits = match &waits {
                Some(w) if self.shared.live.receiver_count() > 0 => w().await,
                _ => None,
            };
            let series = prom::parse(&metrics());
            let current = status.borrow().clone();
            let (point, next) =
                sample::point(herd_core::unix_ms(), &current, &series, &counters, waits);
            counters = next;
            let changes = {
                let points = lock(&self.shared.points);
                points
                    .last()
                    .map(|before| sample::read_pool_changes(before, &point, &current))
                    .unwrap_or_default()
            };
            for e in changes {
                if e.kind == herd_core::EventKind::LeftReadPool && !e.ok {
                    held.push(e);
                } else {
                    self.record_event(e);
                }
            }
            // Held long enough for the supervisor to report a promotion that explains them.
            let (due, wait): (Vec<_>, Vec<_>) = held
                .drain(..)
                .partition(|e| point.t >= e.unix_ms + sample::LEFT_EXPLAIN_MS);
            held = wait;
            for e in due {
                let recent: Vec<ClusterEvent> = lock(&self.shared.events).iter().cloned().collect();
                self.record_event(sample::explain_left(e, &recent));
            }
            if self.shared.live.receiver_count() > 0 {
                let live = Live {
                    point: &point,
                    status: &current,
                };
                if let Ok(json) = serde_json::to_string(&live) {
                    let _ = self.shared.live.send(Frame {
                        kind: "sample",
                        data: json.into(),
                    });
                }
            }
            lock(&self.shared.points).push(point);
        }
    }
}

/// A poisoned lock only means a panic elsewhere mid-push; the ring is still consistent.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
