//! End-to-end check against a real PostgreSQL 15 server: a role is
//! created from a verifier we computed, then we log in over TCP with a
//! password and with the bare ClientKey (the proxy's pass-through).
//!
//! Runs with the rest of the suite (CI installs PostgreSQL 15).
//! Needs `/usr/lib/postgresql/15/bin` (or `HERD_SCRAM_PG_BIN`); as root, runs
//! the server as the `postgres` user via `runuser`.
#![allow(clippy::unwrap_used, missing_docs)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;

use herd_scram::{ClientExchange, ClientKey, Verifier};

struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    as_root: bool,
}

impl Cluster {
    fn cmd(&self, tool: &str) -> Command {
        let exe = self.bin.join(tool);
        if self.as_root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        }
    }

    fn start() -> Cluster {
        let bin = PathBuf::from(
            std::env::var("HERD_SCRAM_PG_BIN")
                .unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into()),
        );
        let dir = std::env::temp_dir().join(format!("herd-scram-pg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let as_root = Command::new("id")
            .arg("-u")
            .output()
            .map(|o| o.stdout.starts_with(b"0"))
            .unwrap_or(false);
        if as_root {
            run(Command::new("chown").args(["postgres:postgres"]).arg(&dir));
        }
        let port = herd_testkit::free_port_block(1);
        let cluster = Cluster {
            bin,
            dir,
            port,
            as_root,
        };
        let data = cluster.dir.join("data");
        run(cluster
            .cmd("initdb")
            .args([
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-D",
            ])
            .arg(&data));
        run(cluster.cmd("pg_ctl").arg("-D").arg(&data).args([
            "-w",
            "-l",
            &cluster.dir.join("log").to_string_lossy(),
            "-o",
            &format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1",
                cluster.port,
                cluster.dir.display()
            ),
            "start",
        ]));
        cluster
    }

    fn psql(&self, sql: &str) -> String {
        let out = self
            .cmd("psql")
            .args(["-X", "-At", "-U", "postgres", "-d", "postgres", "-h"])
            .arg(&self.dir)
            .args(["-p", &self.port.to_string(), "-c", sql])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .cmd("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read_msg(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut head = [0u8; 5];
    s.read_exact(&mut head).unwrap();
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut body = vec![0; len - 4];
    s.read_exact(&mut body).unwrap();
    (head[0], body)
}

fn send(s: &mut TcpStream, tag: u8, body: &[u8]) {
    let mut msg = vec![tag];
    msg.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    msg.extend_from_slice(body);
    s.write_all(&msg).unwrap();
}

/// Expects an `AuthenticationSASL*` message with `code`; returns its data.
fn expect_auth(s: &mut TcpStream, code: u32) -> Result<Vec<u8>, String> {
    let (tag, body) = read_msg(s);
    if tag == b'E' {
        return Err(String::from_utf8_lossy(&body).into_owned());
    }
    assert_eq!(tag, b'R');
    assert_eq!(u32::from_be_bytes(body[..4].try_into().unwrap()), code);
    Ok(body[4..].to_vec())
}

/// Logs in as `user` with `client`; Ok after ReadyForQuery, Err(server error text).
fn login(port: u16, user: &str, mut client: ClientExchange) -> Result<(), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut startup = 196608u32.to_be_bytes().to_vec();
    for kv in ["user", user, "database", "postgres"] {
        startup.extend_from_slice(kv.as_bytes());
        startup.push(0);
    }
    startup.push(0);
    let mut packet = (startup.len() as u32 + 4).to_be_bytes().to_vec();
    packet.extend_from_slice(&startup);
    s.write_all(&packet).unwrap();

    let mechanisms = expect_auth(&mut s, 10)?;
    assert!(mechanisms.starts_with(b"SCRAM-SHA-256\0"));
    let first = client.client_first();
    let mut body = b"SCRAM-SHA-256\0".to_vec();
    body.extend_from_slice(&(first.len() as u32).to_be_bytes());
    body.extend_from_slice(&first);
    send(&mut s, b'p', &body);
    let server_first = expect_auth(&mut s, 11)?;
    let client_final = client.client_final(&server_first).unwrap();
    send(&mut s, b'p', &client_final);
    let server_final = expect_auth(&mut s, 12)?;
    client.verify_server_final(&server_final).unwrap();
    expect_auth(&mut s, 0)?;
    loop {
        match read_msg(&mut s) {
            (b'Z', _) => break,
            (b'E', body) => return Err(String::from_utf8_lossy(&body).into_owned()),
            _ => {}
        }
    }
    send(&mut s, b'X', &[]);
    Ok(())
}

#[test]
fn real_server_accepts_password_and_recovered_client_key() {
    let bin =
        std::env::var("HERD_SCRAM_PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into());
    if !Path::new(&bin).join("initdb").exists() {
        eprintln!("skipping: no PostgreSQL binaries in {bin}");
        return;
    }
    let cluster = Cluster::start();
    let verifier = Verifier::from_password("secret", b"0123456789abcdef", 4096);
    cluster.psql(&format!("CREATE ROLE alice LOGIN PASSWORD '{verifier}'"));
    let stored = cluster.psql("SELECT rolpassword FROM pg_authid WHERE rolname = 'alice'");
    assert_eq!(Verifier::parse(&stored).unwrap(), verifier);

    // Password login.
    login(
        cluster.port,
        "alice",
        ClientExchange::with_password("secret"),
    )
    .unwrap();
    let key = herd_scram_key("secret", &verifier);

    // Pass-through login with only the ClientKey (+ ServerKey to check the server).
    login(
        cluster.port,
        "alice",
        ClientExchange::with_verifier(key.clone(), &verifier),
    )
    .unwrap();
    login(
        cluster.port,
        "alice",
        ClientExchange::with_client_key(key, Some(*verifier.server_key())),
    )
    .unwrap();

    // Wrong credentials are refused by the server.
    let err = login(cluster.port, "alice", ClientExchange::with_password("nope")).unwrap_err();
    assert!(err.contains("28P01"), "{err}");
    let err = login(
        cluster.port,
        "alice",
        ClientExchange::with_client_key(ClientKey::from_bytes([9; 32]), None),
    )
    .unwrap_err();
    assert!(err.contains("28P01"), "{err}");
}

/// The ClientKey of `password` for `verifier`, obtained the way the proxy
/// does: by authenticating a client against the verifier.
fn herd_scram_key(password: &str, verifier: &Verifier) -> ClientKey {
    let mut client = ClientExchange::with_password(password);
    let mut server = herd_scram::ServerExchange::new(verifier.clone());
    let sf = server.server_first(&client.client_first()).unwrap();
    let cf = client.client_final(&sf).unwrap();
    server.server_final(&cf).unwrap().1
}
