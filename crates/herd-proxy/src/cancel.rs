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
    slots: Mutex<HashMap<(i32, i32), Weak<CancelSlot>>>,
}

impl CancelRegistry {
    /// A fresh random key for a new client, and its slot.
    pub fn register(&self) -> ((i32, i32), Arc<CancelSlot>) {
        let slot = Arc::new(CancelSlot::default());
        let mut slots = match self.slots.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        slots.retain(|_, w| w.strong_count() > 0);
        loop {
            let key = (rand::random::<i32>() & 0x7fff_ffff, rand::random::<i32>());
            if let std::collections::hash_map::Entry::Vacant(e) = slots.entry(key) {
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
        slots.retain(|_, w| w.strong_count() > 0);
        if let std::collections::hash_map::Entry::Vacant(e) = slots.entry(key) {
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
