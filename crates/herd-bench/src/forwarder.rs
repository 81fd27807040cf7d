//! A plain TCP forwarder on tokio (one upstream connection per client, over TCP or the server's
//! Unix socket like Herd's proxy, bytes copied both ways, nothing parsed): the floor of "one extra hop" that the proxy's cost is to be
//! compared with. It runs on its own thread with a current-thread runtime, like `herd up` on a
//! small machine, and stops when dropped.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::oneshot;

use crate::BenchError;

/// Where a forwarder sends its bytes.
#[derive(Clone, Debug)]
pub enum Upstream {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A Unix-domain socket file.
    Unix(PathBuf),
}

/// A running forwarder from a local port to `upstream`.
pub struct Forwarder {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    /// The thread it runs on (a thread of this process), to keep with the servers when the
    /// load generator runs apart.
    pub tid: u32,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Forwarder {
    /// Listens on a free port of 127.0.0.1 and forwards every connection to `upstream`.
    pub fn start(upstream: Upstream) -> Result<Forwarder, BenchError> {
        let std_listener = std::net::TcpListener::bind(("127.0.0.1", 0))
            .map_err(|e| BenchError::io("binding a port on", "127.0.0.1", e))?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| BenchError::io("configuring the forwarder socket on", "127.0.0.1", e))?;
        let port = std_listener
            .local_addr()
            .map_err(|e| BenchError::io("reading the port of", "127.0.0.1", e))?
            .port();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .map_err(|e| BenchError::io("starting a runtime for", "the TCP forwarder", e))?;
        let (stop, stopped) = oneshot::channel::<()>();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let _ = tid_tx.send(nix::unistd::gettid().as_raw() as u32);
            runtime.block_on(async move {
                let Ok(listener) = TcpListener::from_std(std_listener) else {
                    return;
                };
                tokio::select! {
                    _ = stopped => {}
                    _ = serve(listener, Arc::new(upstream)) => {}
                }
            });
        });
        let tid = tid_rx.recv().map_err(|_| {
            BenchError::Missing("the TCP forwarder's thread ended as it started".into())
        })?;
        Ok(Forwarder {
            port,
            tid,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

async fn serve(listener: TcpListener, upstream: Arc<Upstream>) {
    while let Ok((mut client, _)) = listener.accept().await {
        let upstream = Arc::clone(&upstream);
        tokio::spawn(async move {
            let _ = client.set_nodelay(true);
            match &*upstream {
                Upstream::Tcp(addr) => {
                    if let Ok(mut server) = TcpStream::connect(addr).await {
                        let _ = server.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                }
                Upstream::Unix(path) => {
                    if let Ok(mut server) = UnixStream::connect(path).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                }
            }
        });
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
