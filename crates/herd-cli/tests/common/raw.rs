//! A bare PostgreSQL protocol client for end-to-end tests that need exact control over the
//! messages (pipelines without Sync, unnamed statements across units, huge batches): what
//! drivers do, message by message, against the real endpoint.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use herd_wire::{encode, split_frame};

/// One message from the server.
#[derive(Clone, Debug)]
pub struct Msg {
    /// Its tag.
    pub tag: u8,
    /// Its body.
    pub body: Vec<u8>,
}

impl Msg {
    /// The SQLSTATE of an ErrorResponse or NoticeResponse.
    pub fn code(&self) -> Option<String> {
        self.field(b'C')
    }

    /// A field of an ErrorResponse or NoticeResponse.
    pub fn field(&self, kind: u8) -> Option<String> {
        let mut rest = self.body.as_slice();
        while let Some((&k, tail)) = rest.split_first() {
            if k == 0 {
                return None;
            }
            let end = tail.iter().position(|b| *b == 0)?;
            if k == kind {
                return Some(String::from_utf8_lossy(&tail[..end]).into_owned());
            }
            rest = &tail[end + 1..];
        }
        None
    }

    /// The columns of a DataRow (`None` for NULL).
    pub fn columns(&self) -> Vec<Option<Vec<u8>>> {
        let b = &self.body;
        let n = u16::from_be_bytes([b[0], b[1]]) as usize;
        let mut at = 2;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let len = i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
            at += 4;
            if len < 0 {
                out.push(None);
            } else {
                out.push(Some(b[at..at + len as usize].to_vec()));
                at += len as usize;
            }
        }
        out
    }

    /// The first column of a DataRow as text.
    pub fn text(&self) -> String {
        self.columns()
            .first()
            .cloned()
            .flatten()
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_default()
    }

    /// Name and value of a ParameterStatus.
    pub fn parameter(&self) -> (String, Vec<u8>) {
        let end = self.body.iter().position(|b| *b == 0).unwrap_or(0);
        let name = String::from_utf8_lossy(&self.body[..end]).into_owned();
        let rest = &self.body[end + 1..];
        let vend = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
        (name, rest[..vend].to_vec())
    }
}

/// A logged-in connection.
pub struct Raw {
    /// The socket.
    pub stream: TcpStream,
    buf: Vec<u8>,
    /// The messages after authentication, up to the first ReadyForQuery.
    pub greeting: Vec<Msg>,
}

/// User, password, host port and database of a `postgresql://` URL printed by `herd url`.
pub fn url_parts(url: &str) -> (String, String, u16, String) {
    let rest = url.trim().trim_start_matches("postgresql://");
    let (cred, rest) = rest.split_once('@').expect("credentials in url");
    let (user, password) = cred.split_once(':').expect("password in url");
    let (hostport, db) = rest.split_once('/').expect("database in url");
    let db = db.split('?').next().unwrap_or("postgres");
    let port = hostport
        .rsplit(':')
        .next()
        .expect("port")
        .parse()
        .expect("port number");
    (user.into(), password.into(), port, db.into())
}

impl Raw {
    /// Logs in to the server of `url` with extra startup parameters.
    pub fn connect(url: &str, params: &[(&str, &str)]) -> Raw {
        let (user, password, port, db) = url_parts(url);
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let mut raw = Raw {
            stream,
            buf: Vec::new(),
            greeting: Vec::new(),
        };
        let mut all = vec![("user", user.as_str()), ("database", db.as_str())];
        all.extend_from_slice(params);
        let mut out = Vec::new();
        encode::startup_message(&mut out, &all).expect("startup");
        raw.send(&out);
        let mut exchange = herd_scram::ClientExchange::with_password(&password);
        loop {
            let m = raw.recv();
            match m.tag {
                b'R' => {
                    let kind = i32::from_be_bytes([m.body[0], m.body[1], m.body[2], m.body[3]]);
                    match kind {
                        10 => {
                            let mut out = Vec::new();
                            encode::sasl_initial_response(
                                &mut out,
                                "SCRAM-SHA-256",
                                Some(&exchange.client_first()),
                            )
                            .expect("sasl");
                            raw.send(&out);
                        }
                        11 => {
                            let fin = exchange.client_final(&m.body[4..]).expect("scram");
                            let mut out = Vec::new();
                            encode::sasl_response(&mut out, &fin).expect("sasl");
                            raw.send(&out);
                        }
                        _ => {}
                    }
                }
                b'E' => panic!("login failed: {:?}", m.field(b'M')),
                b'Z' => {
                    raw.greeting.push(m);
                    return raw;
                }
                _ => raw.greeting.push(m),
            }
        }
    }

    /// The greeting's ParameterStatus value of `name`.
    pub fn parameter(&self, name: &str) -> Option<Vec<u8>> {
        self.greeting
            .iter()
            .filter(|m| m.tag == b'S')
            .map(Msg::parameter)
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    /// The greeting's BackendKeyData (pid, key).
    pub fn backend_key(&self) -> (i32, i32) {
        let m = self.greeting.iter().find(|m| m.tag == b'K').expect("key");
        let b = &m.body;
        (
            i32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            i32::from_be_bytes([b[4], b[5], b[6], b[7]]),
        )
    }

    /// Writes bytes.
    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
    }

    /// The next message; panics after the read timeout.
    pub fn recv(&mut self) -> Msg {
        self.try_recv().expect("connection closed")
    }

    /// The next message, or `None` when the server closed the connection.
    pub fn try_recv(&mut self) -> Option<Msg> {
        loop {
            if let Some((frame, used)) = split_frame(&self.buf, 1 << 30).expect("frame") {
                let m = Msg {
                    tag: frame.tag,
                    body: frame.body.to_vec(),
                };
                self.buf.drain(..used);
                return Some(m);
            }
            let mut chunk = [0u8; 65536];
            match self.stream.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => panic!("no answer in time: {e}"),
            }
        }
    }

    /// Messages up to and including the next ReadyForQuery.
    pub fn until_ready(&mut self) -> Vec<Msg> {
        let mut out = Vec::new();
        loop {
            let m = self.recv();
            let done = m.tag == b'Z';
            out.push(m);
            if done {
                return out;
            }
        }
    }

    /// Runs a simple query; its messages up to ReadyForQuery.
    pub fn query(&mut self, sql: impl AsRef<[u8]>) -> Vec<Msg> {
        let mut out = Vec::new();
        encode::query(&mut out, sql).expect("query");
        self.send(&out);
        self.until_ready()
    }
}

/// Builders of extended-protocol messages.
pub fn parse(out: &mut Vec<u8>, name: &str, sql: impl AsRef<[u8]>) {
    encode::parse(out, name, sql, &[]).expect("parse");
}

/// Bind with text parameters and text results.
pub fn bind(out: &mut Vec<u8>, statement: &str, params: &[&str]) {
    let mut rest = Vec::new();
    rest.extend_from_slice(&0u16.to_be_bytes());
    rest.extend_from_slice(&(params.len() as u16).to_be_bytes());
    for p in params {
        rest.extend_from_slice(&(p.len() as i32).to_be_bytes());
        rest.extend_from_slice(p.as_bytes());
    }
    rest.extend_from_slice(&0u16.to_be_bytes());
    encode::bind_renamed(out, "", statement, &rest).expect("bind");
}

/// Execute of the unnamed portal.
pub fn execute(out: &mut Vec<u8>) {
    encode::execute(out, "", 0).expect("execute");
}

/// Tags of `msgs`, as a string.
pub fn tags(msgs: &[Msg]) -> String {
    msgs.iter().map(|m| m.tag as char).collect()
}

/// The first ErrorResponse's SQLSTATE among `msgs`.
pub fn error_code(msgs: &[Msg]) -> Option<String> {
    msgs.iter().find(|m| m.tag == b'E').and_then(Msg::code)
}

/// Waits until `f` holds, at most `timeout`.
pub fn within(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
