//! CancelRequest routing: each client gets its own key from the proxy; while it has a server
//! attached, the key maps to that server's backend, so a cancel reaches exactly the backend
//! running the client's query.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use herd_wire::encode;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Where a client's query currently runs.
#[derive(Default, Debug)]
pub struct CancelSlot {
    target: Mutex<Target>,
}

/// The backend a client is attached to; the host's buffer is kept between attachments (a
/// client attaches once per transaction: no allocation each time).
#[derive(Default, Debug)]
struct Target {
    attached: bool,
    host: String,
    port: u16,
    backend: (i32, i32),
}

impl CancelSlot {
    /// The client now runs on backend `(pid, key)` at `host:port`.
    pub fn attach(&self, host: &str, port: u16, backend: (i32, i32)) {
        if let Ok(mut t) = self.target.lock() {
            if t.host != host {
                t.host.clear();
                t.host.push_str(host);
            }
            t.port = port;
            t.backend = backend;
            t.attached = true;
        }
    }

    /// The client has no server.
    pub fn detach(&self) {
        if let Ok(mut t) = self.target.lock() {
            t.attached = false;
        }
    }

    /// Host, port and backend key of the attached server, if any.
    fn current(&self) -> Option<(String, u16, i32, i32)> {
        let t = self.target.lock().ok()?;
        t.attached
            .then(|| (t.host.clone(), t.port, t.backend.0, t.backend.1))
    }
}

/// All clients' keys.
#[derive(Default)]
pub struct CancelRegistry {
    slots: Mutex<Keys>,
}

/// The keys, with the entries of clients that left swept out now and then: each login adds
/// one, and sweeping the whole map at every login cost a client that connects per
/// transaction a pass over every other client's key. Hashed with foldhash: the keys are the
/// proxy's own random numbers, so no client chooses what is inserted.
#[derive(Default)]
struct Keys {
    map: HashMap<(i32, i32), Weak<CancelSlot>, foldhash::fast::RandomState>,
    /// Entries left by the last sweep (all of them live then).
    after_sweep: usize,
}

impl Keys {
    /// Drops the entries of clients that left once the map has doubled since the last sweep
    /// (plus a margin): at most twice the live entries plus the margin are kept, and the work
    /// per login is constant on average.
    fn sweep_now_and_then(&mut self) {
        if self.map.len() >= 2 * self.after_sweep + 64 {
            self.map.retain(|_, w| w.strong_count() > 0);
            self.after_sweep = self.map.len();
        }
    }
}

impl CancelRegistry {
    /// A fresh random key for a new client, and its slot.
    pub fn register(&self) -> ((i32, i32), Arc<CancelSlot>) {
        let slot = Arc::new(CancelSlot::default());
        let mut slots = match self.slots.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        slots.sweep_now_and_then();
        loop {
            let key = (rand::random::<i32>() & 0x7fff_ffff, rand::random::<i32>());
            if let std::collections::hash_map::Entry::Vacant(e) = slots.map.entry(key) {
                e.insert(Arc::downgrade(&slot));
                return (key, slot);
            }
        }
    }

    /// Registers a client under `key` (its server's own pid and key, in session pooling), or
    /// under a fresh random key should another client hold that one already.
    pub fn register_as(&self, key: (i32, i32)) -> ((i32, i32), Arc<CancelSlot>) {
        let slot = Arc::new(CancelSlot::default());
        let mut slots = match self.slots.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        slots.sweep_now_and_then();
        if let std::collections::hash_map::Entry::Vacant(e) = slots.map.entry(key) {
            e.insert(Arc::downgrade(&slot));
            return (key, slot);
        }
        drop(slots);
        self.register()
    }

    /// Forwards a CancelRequest for client key `(pid, key)`; unknown keys are ignored, as
    /// PostgreSQL does.
    pub async fn cancel(&self, pid: i32, key: i32) {
        let target = {
            let slots = match self.slots.lock() {
                Ok(s) => s,
                Err(p) => p.into_inner(),
            };
            slots
                .map
                .get(&(pid, key))
                .and_then(Weak::upgrade)
                .and_then(|s| s.current())
        };
        let Some((host, port, bpid, bkey)) = target else {
            return;
        };
        if let Ok(mut stream) = TcpStream::connect((host.as_str(), port)).await {
            let mut out = Vec::new();
            encode::cancel_request(&mut out, bpid, bkey);
            let _ = stream.write_all(&out).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CancelRegistry;

    fn entries(r: &CancelRegistry) -> usize {
        r.slots.lock().map(|k| k.map.len()).unwrap_or(usize::MAX)
    }

    #[test]
    fn keys_of_departed_clients_are_swept_and_live_ones_kept() {
        let registry = CancelRegistry::default();
        let (kept_key, kept) = registry.register();
        let mut most = 0;
        for _ in 0..1_000 {
            let (_, slot) = registry.register();
            drop(slot); // the client left
            most = most.max(entries(&registry));
        }
        assert!(
            most <= 2 + 64,
            "departed clients' keys pile up: {most} entries"
        );
        let live = registry
            .slots
            .lock()
            .map(|k| k.map.get(&kept_key).and_then(|w| w.upgrade()).is_some())
            .unwrap_or(false);
        assert!(live, "a connected client's key was swept");
        drop(kept);
    }
}
