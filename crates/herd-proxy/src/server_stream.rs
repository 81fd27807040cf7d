//! The socket under a server connection: Unix, TCP or TLS over TCP, opened with the options
//! that bound a dead link, with the readiness-style calls the session's relay uses.

use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use herd_pg::ClientTls;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use crate::tls_stream::TlsSocket;
use crate::topology::Endpoint;

/// How long data sent to a server may stay unacknowledged before the connection is dropped.
pub const SERVER_USER_TIMEOUT: Duration = Duration::from_secs(10);

/// Bounds how long a pooled server connection outlives a dead link (a cut network sends no
/// reset): keep-alives probe it after 5 s idle, every 2 s, 3 times, and TCP_USER_TIMEOUT drops
/// it when sent data stays unacknowledged for [`SERVER_USER_TIMEOUT`]. Otherwise a connection
/// that lived through a cut waits out TCP's retransmission back-off after the link heals
/// (retries doubling from 0.2 s: ~13 s after a 12 s cut), and the client's statement with it.
/// The servers do the same on their side (`herd_pg::render_server_conf`).
fn bound_dead_links(s: &TcpStream) -> std::io::Result<()> {
    let sock = socket2::SockRef::from(s);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(5))
        .with_interval(Duration::from_secs(2))
        .with_retries(3);
    sock.set_tcp_keepalive(&keepalive)?;
    sock.set_tcp_user_timeout(Some(SERVER_USER_TIMEOUT))
}

/// The socket to a server: its Unix-domain socket when it runs on this host (pgbench -S
/// measured 16–31 % more transactions per second over it than over TCP loopback), TCP otherwise,
/// TLS over TCP when `[proxy] server_tls` asks for it.
#[derive(Debug)]
pub(crate) enum ServerStream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<TlsSocket>),
}

/// Why a server connection could not be opened.
#[derive(Debug)]
pub(crate) enum Opening {
    /// The socket: refused, unreachable.
    Io(std::io::Error),
    /// TLS: the server declined it, or its certificate did not verify.
    Tls(String),
}

impl From<std::io::Error> for Opening {
    fn from(e: std::io::Error) -> Self {
        Opening::Io(e)
    }
}

/// PostgreSQL's SSLRequest: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

impl ServerStream {
    /// [`ServerStream::connect`], then TLS when `tls` is given: an SSLRequest, the server's
    /// `S`, the handshake. A server that answers `N` or whose certificate does not verify is an
    /// error, never a plain connection. A Unix socket (this host's server, `herd up`) stays
    /// plain: it never leaves the host.
    pub(crate) async fn open(
        ep: &Endpoint,
        tls: Option<&ClientTls>,
    ) -> Result<ServerStream, Opening> {
        let stream = ServerStream::connect(ep).await?;
        let (tls, mut tcp) = match (tls, stream) {
            (Some(tls), ServerStream::Tcp(tcp)) => (tls, tcp),
            (_, stream) => return Ok(stream),
        };
        tcp.write_all(&SSL_REQUEST).await?;
        let mut answer = [0u8; 1];
        tcp.read_exact(&mut answer).await?;
        match answer[0] {
            b'S' => {}
            b'N' => {
                return Err(Opening::Tls(
                    "the server does not serve TLS (ssl = off: is the cluster's CA on its host?)"
                        .into(),
                ))
            }
            other => {
                return Err(Opening::Tls(format!(
                    "the server answered the SSLRequest with {other:#04x}"
                )))
            }
        }
        let conn = tls.connection(&ep.host).map_err(Opening::Tls)?;
        let t = TlsSocket::handshake(tcp, rustls::Connection::Client(conn))
            .await
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::InvalidData => Opening::Tls(e.to_string()),
                _ => Opening::Io(e),
            })?;
        Ok(ServerStream::Tls(Box::new(t)))
    }

    /// Connects to `ep`'s socket when it has one that accepts, else over TCP: a server adopted
    /// from before Herd gave it a socket, or one whose socket is gone, is still reachable.
    async fn connect(ep: &Endpoint) -> std::io::Result<ServerStream> {
        if let Some(path) = &ep.socket {
            match UnixStream::connect(path).await {
                Ok(s) => return Ok(ServerStream::Unix(s)),
                Err(e) => tracing::debug!(
                    node = %ep.name,
                    "socket {} refused ({e}); using TCP",
                    path.display()
                ),
            }
        }
        let s = TcpStream::connect((ep.host.as_str(), ep.port)).await?;
        s.set_nodelay(true)?;
        bound_dead_links(&s)?;
        Ok(ServerStream::Tcp(s))
    }

    pub(crate) async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            ServerStream::Tcp(s) => s.write_all(bytes).await,
            ServerStream::Unix(s) => s.write_all(bytes).await,
            ServerStream::Tls(t) => t.write_all(bytes).await,
        }
    }

    pub(crate) async fn read_buf(&mut self, buf: &mut BytesMut) -> std::io::Result<usize> {
        match self {
            ServerStream::Tcp(s) => s.read_buf(buf).await,
            ServerStream::Unix(s) => s.read_buf(buf).await,
            ServerStream::Tls(t) => t.read_buf(buf).await,
        }
    }

    /// A raw read of the socket (for TLS: of the encrypted stream), only to tell whether an
    /// idle connection was closed or sent something: either makes it unusable.
    pub(crate) fn try_read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            ServerStream::Tcp(s) => s.try_read(buf),
            ServerStream::Unix(s) => s.try_read(buf),
            ServerStream::Tls(t) => t.tcp().try_read(buf),
        }
    }

    pub(crate) fn try_read_buf(&mut self, buf: &mut BytesMut) -> std::io::Result<usize> {
        match self {
            ServerStream::Tcp(s) => crate::drained::read_drained(s, buf),
            ServerStream::Unix(s) => crate::drained::read_drained(s, buf),
            ServerStream::Tls(t) => t.try_read_buf(buf),
        }
    }

    pub(crate) fn try_write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            ServerStream::Tcp(s) => s.try_write(buf),
            ServerStream::Unix(s) => s.try_write(buf),
            ServerStream::Tls(t) => t.try_write(buf),
        }
    }

    pub(crate) fn has_backlog(&self) -> bool {
        match self {
            ServerStream::Tls(t) => t.has_backlog(),
            _ => false,
        }
    }

    pub(crate) fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self {
            ServerStream::Tcp(s) => s.poll_read_ready(cx),
            ServerStream::Unix(s) => s.poll_read_ready(cx),
            ServerStream::Tls(t) => t.poll_readable(cx),
        }
    }

    pub(crate) fn poll_writable(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self {
            ServerStream::Tcp(s) => s.poll_write_ready(cx),
            ServerStream::Unix(s) => s.poll_write_ready(cx),
            ServerStream::Tls(t) => t.poll_writable(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The options are read back from the kernel on a real connection.
    #[tokio::test]
    async fn tcp_server_connections_bound_dead_links() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listen");
        let port = listener.local_addr().expect("addr").port();
        let ep = Endpoint {
            name: herd_core::NodeName::from_text("node0"),
            host: "127.0.0.1".into(),
            port,
            socket: None,
        };
        let (stream, accepted) = tokio::join!(ServerStream::connect(&ep), listener.accept());
        let _peer = accepted.expect("accept");
        let ServerStream::Tcp(tcp) = stream.expect("connect") else {
            panic!("no socket given: TCP expected");
        };
        let sock = socket2::SockRef::from(&tcp);
        assert!(sock.keepalive().expect("SO_KEEPALIVE"));
        assert_eq!(
            sock.tcp_keepalive_time().expect("idle"),
            Duration::from_secs(5)
        );
        assert_eq!(
            sock.tcp_keepalive_interval().expect("interval"),
            Duration::from_secs(2)
        );
        assert_eq!(sock.tcp_keepalive_retries().expect("count"), 3);
        assert_eq!(
            sock.tcp_user_timeout().expect("TCP_USER_TIMEOUT"),
            Some(SERVER_USER_TIMEOUT)
        );
        assert!(tcp.nodelay().expect("nodelay"));
    }

    /// A CA of `cluster`, a server certificate of it for `name`, and the server's TLS settings.
    fn server_side(
        cluster: &str,
        name: &str,
    ) -> (tempfile::TempDir, String, Arc<rustls::ServerConfig>) {
        use std::os::unix::fs::PermissionsExt;
        let ca = herd_certs::ClusterCa::generate(cluster).expect("CA");
        let issued = ca.issue("node0", &[name.to_string()]).expect("issued");
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = (dir.path().join("s.crt"), dir.path().join("s.key"));
        std::fs::write(&cert, &issued.cert_pem).expect("cert");
        std::fs::write(&key, &issued.key_pem).expect("key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::fs::write(dir.path().join("ca.crt"), &ca.cert_pem).expect("ca");
        let tls = crate::tls::ServerTls::load(&cert, &key, true).expect("server TLS");
        (dir, ca.cert_pem, tls.config)
    }

    fn client_side(ca_pem: &str) -> (tempfile::TempDir, ClientTls) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, ca_pem).expect("ca");
        let tls = ClientTls::new(herd_pg::TlsMode::VerifyFull, &path)
            .expect("CA")
            .expect("verify-full");
        (dir, tls)
    }

    /// A server on loopback that answers the SSLRequest with `answer`, then (with `config`)
    /// runs the handshake and echoes what it reads until the client closes.
    async fn fake_server(answer: u8, config: Option<Arc<rustls::ServerConfig>>) -> Endpoint {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listen");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            let Ok((mut tcp, _)) = listener.accept().await else {
                return;
            };
            let mut request = [0u8; 8];
            if tcp.read_exact(&mut request).await.is_err() || request != SSL_REQUEST {
                return;
            }
            if tcp.write_all(&[answer]).await.is_err() {
                return;
            }
            let Some(config) = config else { return };
            let Ok(mut s) = crate::client::ClientStream::accept_tls(tcp, config).await else {
                return;
            };
            let mut buf = BytesMut::with_capacity(64 * 1024);
            while let Ok(n) = s.read_buf(&mut buf).await {
                if n == 0 || s.write_all(&buf.split()).await.is_err() {
                    return;
                }
            }
        });
        Endpoint {
            name: herd_core::NodeName::from_text("node0"),
            host: "127.0.0.1".into(),
            port,
            socket: None,
        }
    }

    fn tls_refusal(r: Result<ServerStream, Opening>) -> String {
        match r {
            Err(Opening::Tls(why)) => why,
            other => panic!("a TLS refusal expected: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_server_declining_tls_is_refused_not_used_in_plain() {
        let (_d, ca, _) = server_side("t", "127.0.0.1");
        let (_c, tls) = client_side(&ca);
        let ep = fake_server(b'N', None).await;
        let why = tls_refusal(ServerStream::open(&ep, Some(&tls)).await);
        assert!(why.contains("does not serve TLS"), "{why}");
    }

    #[tokio::test]
    async fn certificates_of_another_ca_or_for_another_address_are_refused() {
        let (_d, _ca, config) = server_side("t", "127.0.0.1");
        let (_o, other_ca, _) = server_side("other", "127.0.0.1");
        let (_c, tls) = client_side(&other_ca);
        let ep = fake_server(b'S', Some(config)).await;
        let why = tls_refusal(ServerStream::open(&ep, Some(&tls)).await);
        assert!(why.contains("invalid peer certificate"), "{why}");
        assert!(why.contains("UnknownIssuer"), "{why}");

        let (_d, ca, config) = server_side("t", "10.0.0.1");
        let (_c, tls) = client_side(&ca);
        let ep = fake_server(b'S', Some(config)).await;
        let why = tls_refusal(ServerStream::open(&ep, Some(&tls)).await);
        assert!(why.contains("invalid peer certificate"), "{why}");
        assert!(why.contains("not valid for name \"127.0.0.1\""), "{why}");
    }

    /// More than the sockets hold both ways: writes leave encrypted bytes behind (the
    /// backlog) and reads span many records.
    #[tokio::test]
    async fn a_verified_server_carries_large_messages_both_ways() {
        let (_d, ca, config) = server_side("t", "127.0.0.1");
        let (_c, tls) = client_side(&ca);
        let ep = fake_server(b'S', Some(config)).await;
        let mut s = ServerStream::open(&ep, Some(&tls)).await.expect("TLS");
        assert!(matches!(s, ServerStream::Tls(_)));
        let sent: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
        let mut back = BytesMut::new();
        let mut rest = &sent[..];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while back.len() < sent.len() {
            assert!(tokio::time::Instant::now() < deadline, "echo stalled");
            if !rest.is_empty() || s.has_backlog() {
                match s.try_write(rest) {
                    Ok(n) => rest = &rest[n..],
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("write: {e}"),
                }
            }
            back.reserve(64 * 1024);
            match s.try_read_buf(&mut back) {
                Ok(0) => panic!("closed"),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(e) => panic!("read: {e}"),
            }
        }
        assert!(back[..] == sent[..], "the echo differs");
    }
}
